#include "bnfold/api/batch.h"

#include <algorithm>
#include <filesystem>
#include <map>
#include <set>

#include "bnfold/error.h"

namespace bnfold {
namespace fs = std::filesystem;
namespace {

// The identity used to drop a model reached twice (a file given directly and again through its folder).
std::string identityOf(const fs::path& path) {
  std::error_code ec;
  fs::path canonical = fs::weakly_canonical(path, ec);
  return ec ? path.lexically_normal().string() : canonical.string();
}

bool isExcluded(const fs::path& dir, const std::vector<fs::path>& excluded) {
  std::error_code ec;
  for (const fs::path& other : excluded)
    if (fs::equivalent(dir, other, ec)) return true;
  return false;
}

}  // namespace

std::vector<ModelFile> collectModelFiles(const std::vector<std::string>& inputs,
                                         const std::vector<std::string>& excludedDirs) {
  std::vector<fs::path> excluded;
  for (const std::string& dir : excludedDirs) {
    std::error_code ec;
    if (!dir.empty() && fs::is_directory(dir, ec)) excluded.emplace_back(dir);
  }
  std::vector<ModelFile> files;
  std::set<std::string> seen;
  auto add = [&](const fs::path& path, const fs::path& relative) {
    if (seen.insert(identityOf(path)).second) files.push_back({path.string(), relative.generic_string()});
  };
  for (const std::string& input : inputs) {
    std::error_code ec;
    if (!fs::is_directory(input, ec)) {
      add(input, fs::path(input).filename());
      continue;
    }
    const fs::path root(input);
    std::vector<fs::path> found;
    fs::recursive_directory_iterator it(root, fs::directory_options::skip_permission_denied, ec), end;
    if (ec) throw Error(input, "cannot read the folder: " + ec.message());
    for (; it != end; it.increment(ec)) {
      if (ec) throw Error(input, "cannot read the folder: " + ec.message());
      if (it->is_directory(ec)) {
        if (isExcluded(it->path(), excluded)) it.disable_recursion_pending();
        continue;
      }
      if (it->path().extension() == ".onnx" && it->is_regular_file(ec)) found.push_back(it->path());
    }
    std::vector<std::pair<std::string, fs::path>> sorted;
    for (const fs::path& path : found) sorted.emplace_back(path.lexically_relative(root).generic_string(), path);
    std::sort(sorted.begin(), sorted.end());
    if (sorted.empty()) throw Error(input, "no *.onnx file in this folder");
    for (const auto& [relative, path] : sorted) add(path, relative);
  }
  return files;
}

std::string reportPathFor(const std::string& modelPath) {
  fs::path path(modelPath);
  if (path.extension() == ".onnx") return path.replace_extension(".report.json").string();
  return modelPath + ".report.json";
}

std::vector<PlannedFold> planBatchFold(const std::vector<std::string>& inputs, const BatchDestinations& destinations) {
  std::vector<PlannedFold> planned;
  for (ModelFile& model : collectModelFiles(inputs, {destinations.outDir, destinations.reportDir})) {
    PlannedFold item{std::move(model), "", ""};
    if (!destinations.outDir.empty()) item.output = (fs::path(destinations.outDir) / item.model.relative).string();
    else if (destinations.inPlace) item.output = item.model.path;
    if (!destinations.reportDir.empty())
      item.report = reportPathFor((fs::path(destinations.reportDir) / item.model.relative).string());
    else if (!item.output.empty()) item.report = reportPathFor(item.output);
    planned.push_back(std::move(item));
  }
  // Two inputs with the same relative path (from different folders) would overwrite each other's results.
  std::map<std::string, std::string> writers;
  for (const PlannedFold& item : planned) {
    for (const std::string* target : {&item.output, &item.report}) {
      if (target->empty() || destinations.inPlace) continue;
      auto [it, fresh] = writers.emplace(fs::path(*target).lexically_normal().string(), item.model.path);
      if (!fresh)
        throw Error("", "'" + it->second + "' and '" + item.model.path + "' would both be written to '" + *target +
                            "'; process them in separate runs");
    }
  }
  return planned;
}

}  // namespace bnfold
