#include "bnfold/report/report.h"

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

void Report::add(const std::string& section, nlohmann::json entry) {
  auto& array = doc_[section];
  if (array.is_null()) array = nlohmann::json::array();
  array.push_back(std::move(entry));
}

const nlohmann::json& Report::section(const std::string& name) const {
  static const nlohmann::json empty = nlohmann::json::array();
  auto it = doc_.find(name);
  return it == doc_.end() ? empty : *it;
}

std::size_t Report::rewriteCount() const {
  std::size_t count = 0;
  for (const auto& [key, value] : doc_.items())
    if (value.is_array() && key != "skipped" && key != "rules" && key != kReorderedSection) count += value.size();
  return count;
}

std::string Report::dump() const { return doc_.dump(2) + "\n"; }

void Report::write(const std::string& path) const { writeFileAtomically(path, dump()); }

}  // namespace bnfold
