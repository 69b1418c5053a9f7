#include "bnfold/report/report_record.h"

#include <cstring>

namespace bnfold {

ReportRecord::ReportRecord(std::size_t fields, std::size_t textBytes, std::size_t numbers) {
  fields_.reserve(fields);
  text_.reserve(textBytes);
  numbers_.reserve(numbers);
}

ReportRecord::Field& ReportRecord::field(Key key) {
  // A record has a few dozen fields at most: a search in order is cheap when a field of another name costs one
  // comparison of lengths (by strcmp, the searches of a fold's record of 23 fields were 7% of the rules phase).
  for (Field& existing : fields_)
    if (existing.keyLength == key.length() && std::memcmp(existing.key, key.name(), key.length()) == 0)
      return existing;
  Field& added = fields_.emplace_back();
  added.key = key.name();
  added.keyLength = key.length();
  return added;
}

void ReportRecord::setText(Key key, std::string_view text) {
  Field& target = field(key);
  target.kind = Kind::Text;
  target.span = {static_cast<std::uint32_t>(text_.size()), static_cast<std::uint32_t>(text.size())};
  text_.append(text);
}

void ReportRecord::setNumber(Key key, double number) {
  Field& target = field(key);
  target.kind = Kind::Number;
  target.number = number;
}

void ReportRecord::setInteger(Key key, int64_t integer) {
  Field& target = field(key);
  target.kind = Kind::Integer;
  target.integer = integer;
}

void ReportRecord::setBool(Key key, bool flag) {
  Field& target = field(key);
  target.kind = Kind::Bool;
  target.flag = flag;
}

void ReportRecord::setNull(Key key) { field(key).kind = Kind::Null; }

void ReportRecord::setTextOrNull(Key key, const std::string* text) {
  if (text) setText(key, *text);
  else setNull(key);
}

void ReportRecord::setNumbers(Key key, const std::vector<double>& numbers) {
  Field& target = field(key);
  target.kind = Kind::Numbers;
  target.span = {static_cast<std::uint32_t>(numbers_.size()), static_cast<std::uint32_t>(numbers.size())};
  numbers_.insert(numbers_.end(), numbers.begin(), numbers.end());
}

void ReportRecord::setJson(Key key, nlohmann::json value) {
  Field& target = field(key);
  target.kind = Kind::Json;
  target.span = {static_cast<std::uint32_t>(json_.size()), 1};
  json_.push_back(std::move(value));
}

nlohmann::json ReportRecord::toJson() const {
  nlohmann::json object = nlohmann::json::object();
  for (const Field& field : fields_) {
    nlohmann::json& value = object[field.key];
    switch (field.kind) {
      case Kind::Null:
        break;
      case Kind::Bool:
        value = field.flag;
        break;
      case Kind::Integer:
        value = field.integer;
        break;
      case Kind::Number:
        value = field.number;
        break;
      case Kind::Text:
        value = std::string_view(text_).substr(field.span.offset, field.span.size);
        break;
      case Kind::Numbers: {
        const double* first = numbers_.data() + field.span.offset;
        value = std::vector<double>(first, first + field.span.size);
        break;
      }
      case Kind::Json:
        value = json_[field.span.offset];
        break;
    }
  }
  return object;
}

}  // namespace bnfold
