#pragma once
/// \file
/// One report entry as a flat list of fields, turned into a JSON object only when the report is read or written.
///
/// A fold's entry built as nlohmann::json is a tree of about 60 heap objects (3.3 KB: a std::map node per key, the
/// parameter arrays element by element). A run on a model with many BatchNormalization nodes holds thousands of
/// them, and on a 10,000-block chain they were most of the memory the rules phase touched for the first time. A
/// record keeps the same fields in four buffers (about 1.2 KB). The JSON is the same either way.

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace bnfold {

class ReportRecord {
 public:
  /// A field's name: a string literal, which the record points to instead of copying.
  class Key {
   public:
    template <std::size_t N>
    constexpr Key(const char (&name)[N])  // NOLINT(google-explicit-constructor): literals only
        : name_(name), length_(static_cast<std::uint32_t>(std::char_traits<char>::length(name))) {}
    const char* name() const { return name_; }
    std::uint32_t length() const { return length_; }

   private:
    const char* name_;
    std::uint32_t length_;
  };

  ReportRecord() = default;
  /// Reserves room so that building the record does not grow its buffers.
  ReportRecord(std::size_t fields, std::size_t textBytes, std::size_t numbers);

  // Each setter adds the field, or replaces it when the record has one of that name (like json's operator[]).
  void setText(Key key, std::string_view text);
  void setNumber(Key key, double number);
  void setInteger(Key key, int64_t integer);
  void setBool(Key key, bool flag);
  void setNull(Key key);
  /// Text, or null when `text` is null (an optional input such as a bias).
  void setTextOrNull(Key key, const std::string* text);
  /// A JSON array of numbers.
  void setNumbers(Key key, const std::vector<double>& numbers);
  /// Any other JSON value (nested objects, arrays of strings): kept as it is.
  void setJson(Key key, nlohmann::json value);

  std::size_t size() const { return fields_.size(); }

  /// The JSON object with every field.
  nlohmann::json toJson() const;

 private:
  enum class Kind : std::uint8_t { Null, Bool, Integer, Number, Text, Numbers, Json };
  struct Span {
    std::uint32_t offset;
    std::uint32_t size;
  };
  struct Field {
    const char* key;
    union {
      bool flag;
      int64_t integer;
      double number;
      // Text: into text_; Numbers: into numbers_; Json: offset into json_ (a report entry is far below 4 GB)
      Span span;
    };
    Kind kind;
    std::uint32_t keyLength;  // compared first: most fields a setter passes by differ in it
  };
  Field& field(Key key);

  std::vector<Field> fields_;
  std::string text_;             // the characters of every text field, one after another
  std::vector<double> numbers_;  // the elements of every array of numbers, one after another
  std::vector<nlohmann::json> json_;
};

}  // namespace bnfold
