#include "bnfold/report/report.h"

#include <string_view>

#include "bnfold/io/atomic_file.h"
#include "bnfold/ir/model.h"
#include "bnfold/version.h"

namespace bnfold {

Report::Report() {
  doc_ = nlohmann::json::object();
  doc_["tool"] = {{"name", "bnfold"}, {"version", kVersion}};
  doc_["format_version"] = kFormatVersion;
  doc_["input"] = nullptr;
  doc_["output"] = nullptr;
  doc_["opset"] = nullptr;
  doc_["rules"] = nlohmann::json::array();
  for (const char* section : kReportSections) doc_[section] = nlohmann::json::array();
  doc_[kReorderedSection] = nlohmann::json::array();
}

void Report::setReorderedGraphs(const std::vector<ReorderedGraph>& graphs) {
  nlohmann::json entries = nlohmann::json::array();
  for (const ReorderedGraph& graph : graphs) {
    entries.push_back({{"graph", graph.graph},
                       {"subgraph_of", graph.subgraph ? nlohmann::json(graph.ownerNode) : nlohmann::json()},
                       {"moved_nodes", graph.movedNodes}});
  }
  doc_[kReorderedSection] = std::move(entries);
}

nlohmann::json& Report::sectionArray(const std::string& section) {
  auto& array = doc_[section];
  if (array.is_null()) array = nlohmann::json::array();
  return array;
}

void Report::add(const std::string& section, nlohmann::json entry) { sectionArray(section).push_back(std::move(entry)); }

void Report::add(const std::string& section, ReportRecord record) {
  auto& array = sectionArray(section);
  records_[section].emplace_back(array.size(), std::move(record));
  array.push_back(nullptr);
}

void Report::materialize(const std::string& section) const {
  auto pending = records_.find(section);
  if (pending == records_.end()) return;
  nlohmann::json& array = doc_.at(section);
  for (const auto& [index, record] : pending->second) array.at(index) = record.toJson();
  records_.erase(pending);
}

const nlohmann::json& Report::section(const std::string& name) const {
  static const nlohmann::json empty = nlohmann::json::array();
  auto it = doc_.find(name);
  if (it == doc_.end()) return empty;
  materialize(name);
  return *it;
}

std::size_t Report::sectionSize(const std::string& name) const {
  auto it = doc_.find(name);
  return it == doc_.end() ? 0 : it->size();
}

nlohmann::json& Report::entry(const std::string& section, std::size_t index) {
  materialize(section);
  return doc_.at(section).at(index);
}

const nlohmann::json& Report::json() const {
  while (!records_.empty()) materialize(records_.begin()->first);
  return doc_;
}

namespace {

struct SectionEntry {
  std::string_view name;
  SectionKind kind;
};

// Every array section bnfold writes. A rule's failureSection belongs here as LeftAlone, or its failures would count
// as rewrites (an unchanged model rewritten by --in-place, findings in `check`).
constexpr SectionEntry kSections[] = {
    {"rules", SectionKind::Other},
    {kReorderedSection, SectionKind::Other},
    {"folds", SectionKind::Rewrites},
    {"bias_absorbed", SectionKind::Rewrites},
    {"scale_folded", SectionKind::Rewrites},
    {"decomposed", SectionKind::Rewrites},
    {"expanded", SectionKind::Rewrites},
    {"frozen", SectionKind::Rewrites},
    {"evaluated", SectionKind::Rewrites},
    {"skipped", SectionKind::LeftAlone},
    {"equalized", SectionKind::Rewrites},
    {"not_equalized", SectionKind::LeftAlone},
    {"high_bias_absorbed", SectionKind::Rewrites},
    {"high_bias_not_absorbed", SectionKind::LeftAlone},
    {"norms_fused", SectionKind::Rewrites},
    {"norms_not_fused", SectionKind::LeftAlone},
    {"norms_decomposed", SectionKind::Rewrites},
    {"norms_not_decomposed", SectionKind::LeftAlone},
    {"norm_affine_forwarded", SectionKind::Rewrites},
    {"norm_affine_not_forwarded", SectionKind::LeftAlone},
    {"relu6_replaced", SectionKind::Rewrites},
};

}  // namespace

SectionKind Report::sectionKind(const std::string& key) {
  for (const SectionEntry& section : kSections)
    if (section.name == key) return section.kind;
  return SectionKind::Rewrites;
}

std::size_t Report::rewriteCount() const {
  std::size_t count = 0;
  for (const auto& [key, value] : doc_.items())
    if (value.is_array() && sectionKind(key) == SectionKind::Rewrites) count += value.size();
  return count;
}

namespace {

// `value` pretty-printed as it would be `depth` levels down in a document printed with dump(2): every line after the
// first is indented by two spaces a level. (A line break in a printed string is escaped, so every '\n' is a line's.)
std::string dumpAtDepth(const nlohmann::json& value, int depth) {
  const std::string text = value.dump(2);
  const std::string indent(static_cast<std::size_t>(2 * depth), ' ');
  std::string out;
  out.reserve(text.size() + text.size() / 8);
  for (char c : text) {
    out += c;
    if (c == '\n') out += indent;
  }
  return out;
}

}  // namespace

std::string Report::dump() const {
  if (records_.empty()) return doc_.dump(2) + "\n";
  // What doc_.dump(2) would print with every record in place, written key by key.
  std::string out = "{";
  bool firstKey = true;
  for (const auto& [key, value] : doc_.items()) {
    out += firstKey ? "\n  " : ",\n  ";
    firstKey = false;
    out += nlohmann::json(key).dump() + ": ";
    auto pending = records_.find(key);
    if (pending == records_.end()) {
      out += dumpAtDepth(value, 1);
      continue;
    }
    auto record = pending->second.begin();
    out += "[";
    for (std::size_t i = 0; i < value.size(); ++i) {
      out += i == 0 ? "\n    " : ",\n    ";
      if (record != pending->second.end() && record->first == i) {
        out += dumpAtDepth(record->second.toJson(), 2);
        ++record;
      } else {
        out += dumpAtDepth(value[i], 2);
      }
    }
    out += "\n  ]";
  }
  out += "\n}\n";
  return out;
}

void Report::write(const std::string& path) const { writeFileAtomically(path, dump()); }

}  // namespace bnfold
