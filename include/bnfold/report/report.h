#pragma once
/// \file
/// The JSON report of a run: what was rewritten (one array per kind of rewrite) and which
/// BatchNormalization nodes were left in place and why. The format is documented in README.md and
/// schema/report.schema.json.

#include <map>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "bnfold/report/report_record.h"

namespace bnfold {

struct ReorderedGraph;

/// The arrays a report always has, in the order they are written.
inline constexpr const char* kReportSections[] = {"folds",  "bias_absorbed", "scale_folded", "decomposed", "expanded",
                                                  "frozen", "evaluated",     "skipped"};
/// The array of graphs sorted on load (see Report::setReorderedGraphs): not a rewrite section.
inline constexpr const char* kReorderedSection = "graph_reordered";

/// What an array in the report lists.
enum class SectionKind {
  Rewrites,   ///< one entry per rewrite done ("folds", "norms_fused", ...)
  LeftAlone,  ///< one entry per node or link a rule left in place, with its reason ("skipped", "norms_not_fused", ...)
  Other,      ///< neither: "rules", "graph_reordered"
};

class Report {
 public:
  Report();
  /// Version of the report format; bumped when a field changes meaning or disappears.
  static constexpr int kFormatVersion = 3;

  void setInput(const std::string& path) { doc_["input"] = path; }
  void setOutput(const std::string& path) { doc_["output"] = path; }
  void setOpset(int64_t version) { doc_["opset"] = version; }
  void setRules(const std::vector<std::string>& rules) { doc_["rules"] = rules; }
  /// The model was converted from ai.onnx opset `from` to `to` before the rules ran (--target-opset).
  void setOpsetConversion(int64_t from, int64_t to) {
    doc_["opset_converted"] = {{"from", from}, {"to", to}, {"by", "onnx version_converter"}};
  }
  /// Fills "graph_reordered" (always present, empty when nothing moved) from Model::reorderedGraphs(): one
  /// {"graph", "subgraph_of", "moved_nodes"} entry per graph whose nodes were sorted on load.
  void setReorderedGraphs(const std::vector<ReorderedGraph>& graphs);

  /// Appends `entry` to `section` (one of kReportSections, or a new one).
  void add(const std::string& section, nlohmann::json entry);
  /// Appends `record` to `section`. It is turned into JSON only when the section is read or the report written
  /// (see ReportRecord for why).
  void add(const std::string& section, ReportRecord record);
  const nlohmann::json& section(const std::string& name) const;
  /// The number of entries in `section`, without turning records into JSON.
  std::size_t sectionSize(const std::string& name) const;
  /// Entry `index` of `section`, to be completed (the driver adds a rewrite's "verify" object).
  nlohmann::json& entry(const std::string& section, std::size_t index);
  /// The run's "verification" summary (present only when --verify was given).
  void setVerification(nlohmann::json summary) { doc_["verification"] = std::move(summary); }
  /// True when the run verified its rewrites (setVerification was called), so entries may hold verdicts.
  bool hasVerification() const { return doc_.contains("verification"); }
  /// Entries in the sections of kind SectionKind::Rewrites: the rewrites done.
  std::size_t rewriteCount() const;
  /// What the array section `key` lists, from one table of every section bnfold writes. A section the table does not
  /// know lists rewrites (a newer rule's); every rule's Rule::failureSection is in it as LeftAlone (a test checks).
  static SectionKind sectionKind(const std::string& key);
  /// Whether the array section `key` lists nodes left alone rather than rewrites.
  static bool isLeftAloneSection(const std::string& key) { return sectionKind(key) == SectionKind::LeftAlone; }

  const nlohmann::json& json() const;
  /// Pretty-printed JSON with a trailing newline. Records are turned into JSON one at a time, so the whole report is
  /// never held as a tree.
  std::string dump() const;
  /// Writes the report atomically.
  void write(const std::string& path) const;

 private:
  /// The array of `section`, made empty when the report has none yet (a section a newer rule adds).
  nlohmann::json& sectionArray(const std::string& section);
  /// Turns the records of `section` into JSON in doc_.
  void materialize(const std::string& section) const;

  // Both mutable: reading a section turns its records into JSON, which changes how it is held, not what it holds.
  mutable nlohmann::json doc_;  // a record's place in its section's array holds null until then
  // Records not yet in doc_, by section: (index in the section's array, record).
  mutable std::map<std::string, std::vector<std::pair<std::size_t, ReportRecord>>, std::less<>> records_;
};

}  // namespace bnfold
