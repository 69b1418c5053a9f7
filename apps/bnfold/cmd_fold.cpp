// `bnfold fold IN -o OUT`: load, run the selected rules, save atomically, write the report.
// `bnfold fold IN... --out-dir DIR | --in-place`: the same for many models (files, and folders searched for
// *.onnx), in parallel; one bad model does not stop the others.

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <set>

#include <spdlog/spdlog.h>

#include "batch.h"
#include "bnfold/api/api.h"
#include "bnfold/api/batch.h"
#include "bnfold/error.h"
#include "bnfold/io/model_io.h"
#include "bnfold/io/atomic_file.h"
#include "bnfold/check/findings.h"
#include "bnfold/report/report.h"
#include "bnfold/check/fold.h"
#include "commands.h"
#include "output.h"

namespace bnfold::cli {
namespace fs = std::filesystem;
namespace {

struct FoldOptions {
  std::vector<std::string> inputs;
  std::string output;
  std::string report;
  std::string outDir;
  std::string reportDir;
  bool inPlace = false;
  std::string backupSuffix;
  bool dryRun = false;
  unsigned jobs = 0;
  RuleFlags ruleFlags;
  bool timings = false;
  bool quiet = false;    // from the global -q
  bool verbose = false;  // from the global -v
};

/// "load 0.012 s, rules 0.003 s, save 0.080 s, total 0.095 s" (the benchmark parses this).
std::string timingsText(const FoldPhaseTimes& times) {
  char line[160];
  std::snprintf(line, sizeof line, "load %.4f s, rules %.4f s, save %.4f s, total %.4f s", times.load, times.rules,
                times.save, times.load + times.rules + times.save);
  return line;
}

/// --timings output: on stderr whatever -q says, because it was asked for.
void printTimings(const std::string& what, const FoldPhaseTimes& times) {
  std::cerr << "bnfold: timings: " << what << (what.empty() ? "" : ": ") << timingsText(times) << "\n";
}

struct Counts {
  std::size_t folded = 0, expanded = 0, skipped = 0, other = 0;
  void add(const Counts& more) {
    folded += more.folded;
    expanded += more.expanded;
    skipped += more.skipped;
    other += more.other;
  }
  static Counts of(const Report& report) {
    Counts counts;
    // A BN split over a Concat of layers has one `folds` entry per layer: count BNs, not entries.
    std::set<std::pair<std::string, std::string>> folded;
    for (const auto& entry : report.section("folds"))
      folded.emplace(entry.value("graph", std::string()), entry.value("bn", std::string()));
    counts.folded = folded.size();
    counts.expanded = report.section("expanded").size();
    counts.skipped = report.section("skipped").size();
    counts.other = report.rewriteCount() - report.section("folds").size() - counts.expanded -
                   report.section("evaluated").size();
    return counts;
  }
  std::string text() const {
    return std::to_string(folded) + " BN folded, " + std::to_string(expanded) + " expanded, " +
           std::to_string(skipped) + " skipped, " + std::to_string(other) + " other rewrites";
  }
};

// "the main graph and 2 subgraphs (5 nodes moved)"
std::string reorderedText(const std::vector<ReorderedGraph>& graphs) {
  std::size_t subgraphs = 0, moved = 0;
  bool mainGraph = false;
  for (const ReorderedGraph& graph : graphs) {
    if (graph.subgraph) ++subgraphs;
    else mainGraph = true;
    moved += graph.movedNodes;
  }
  std::string text = mainGraph ? "the main graph" : "";
  if (subgraphs > 0)
    text += (mainGraph ? " and " : "") + std::to_string(subgraphs) + (subgraphs == 1 ? " subgraph" : " subgraphs");
  return text + " (" + std::to_string(moved) + (moved == 1 ? " node" : " nodes") + " moved)";
}

// Sorting on load changes the written node order, and BNs left only because their parameters are overridable
// defaults would fold with a flag: say each once.
void noteRun(const std::string& input, const FoldFileResult& result) {
  const auto& reordered = result.model->reorderedGraphs();
  if (!reordered.empty())
    spdlog::warn("{}: nodes were not in topological order; sorted {}", input, reorderedText(reordered));
  if (!result.run.inputDefaultsHint.empty()) spdlog::warn("{}: {}", input, result.run.inputDefaultsHint);
}

// ---- one model, one output (the original form of the command) ----

// The model and report of a single-model run live until the process ends. Freeing a graph of 50,000 nodes one
// object at a time takes as long as saving it, and the kernel reclaims the pages at exit anyway. The globals keep
// them reachable, so LeakSanitizer does not count them as leaks.
Model* processLifetimeModel = nullptr;
Report* processLifetimeReport = nullptr;

void keepUntilExit(std::unique_ptr<Model> model, Report&& report) {
  delete processLifetimeModel;  // only ever one of each; a second call must not lose the first
  delete processLifetimeReport;
  processLifetimeModel = model.release();
  processLifetimeReport = new Report(std::move(report));
}

int runSingle(const FoldOptions& options) {
  const DriverOptions driverOptions = driverOptionsFrom(options.ruleFlags);
  const std::string& input = options.inputs.front();
  FoldFileRequest request;
  request.input = input;
  request.output = options.output;
  request.reportPath = options.report == "-" ? "" : options.report;
  request.dryRun = options.dryRun;
  request.targetOpset = options.ruleFlags.targetOpset;
  FoldFileResult result = namingFile(input, [&] { return foldFile(request, driverOptions); });
  noteRun(input, result);
  const Report& report = result.report;
  if (!result.run.failedVerifications.empty()) {
    for (const Finding& failure : result.run.failedVerifications)
      std::cerr << "bnfold: " << input << ": " << failure.message << "\n";
    if (options.report == "-") std::cout << report.dump();
    std::cerr << "bnfold: " << input << ": " << verificationFailureText(result.run, report) << "\n";
    return kExitFindings;
  }
  if (options.timings) printTimings("", result.times);
  if (options.dryRun) {
    std::cout << "dry-run " << input << " -> " << options.output << ": " << Counts::of(report).text()
              << " (nothing written)\n";
    if (options.report == "-") std::cout << report.dump();
    return kExitOk;
  }
  if (options.report == "-") std::cout << report.dump();
  spdlog::info("{}: {} rewrites, {} BatchNormalization left", options.output, report.rewriteCount(),
               report.section("skipped").size());
  keepUntilExit(std::move(result.model), std::move(result.report));
  return kExitOk;
}

// ---- many models ----

struct Outcome {
  bool ok = false;
  bool verifyFailed = false;  // a rewrite failed --verify: no model written, the report was
  bool unchanged = false;  // --in-place and no rule changed anything: the file was left alone
  std::string error;
  Counts counts;
  FoldPhaseTimes times;
};

Outcome foldOne(const PlannedFold& item, const FoldOptions& options, const DriverOptions& driverOptions) {
  Outcome outcome;
  try {
    FoldFileRequest request;
    request.input = item.model.path;
    request.output = item.output;
    request.reportPath = options.dryRun ? "" : item.report;
    request.dryRun = options.dryRun;
    request.inPlace = options.inPlace;
    request.backupSuffix = options.backupSuffix;
    request.createFolders = true;
    request.targetOpset = options.ruleFlags.targetOpset;
    const FoldFileResult result = foldFile(request, driverOptions);
    noteRun(item.model.path, result);
    outcome.times = result.times;
    outcome.counts = Counts::of(result.report);
    const auto& failures = result.run.failedVerifications;
    if (!failures.empty()) {
      outcome.verifyFailed = true;
      outcome.error = failures.front().message +
                      (failures.size() > 1 ? " (and " + std::to_string(failures.size() - 1) + " more)" : "") +
                      "; no model written";
      return outcome;
    }
    outcome.unchanged = result.unchanged;
    outcome.ok = true;
  } catch (...) {
    outcome.ok = false;
    outcome.verifyFailed = false;
    outcome.error = currentErrorMessage(item.model.path);
  }
  return outcome;
}

std::string modelLine(std::size_t index, std::size_t total, const PlannedFold& item, const Outcome& outcome,
                      const FoldOptions& options) {
  std::string line = "[" + std::to_string(index + 1) + "/" + std::to_string(total) + "] ";
  if (!outcome.ok) return line + "failed    " + item.model.path + ": " + outcome.error;
  const char* status = options.dryRun ? "dry-run   " : outcome.unchanged ? "unchanged " : "ok        ";
  line += status + item.model.path;
  if (!item.output.empty() && item.output != item.model.path) line += " -> " + item.output;
  return line + ": " + outcome.counts.text();
}

int runBatch(const FoldOptions& options) {
  DriverOptions driverOptions = driverOptionsFrom(options.ruleFlags);
  const auto started = std::chrono::steady_clock::now();
  const std::vector<PlannedFold> items =
      planBatchFold(options.inputs, BatchDestinations{options.outDir, options.reportDir, options.inPlace});
  const unsigned jobs = effectiveJobs(options.jobs);
  if (jobs > 1 && items.size() > 1) driverOptions.ruleOptions.concurrent = false;  // the models share the cores

  // A dry run's lines are its result (stdout); a real run's are progress (stderr).
  std::FILE* stream = options.dryRun ? stdout : stderr;
  const bool quiet = options.quiet && !options.dryRun;
  const bool useBar = !options.dryRun && !quiet && !options.verbose && isTerminal(stderr);
  ProgressBar bar(stderr, items.size());
  std::vector<Outcome> outcomes(items.size());
  std::size_t finishedCount = 0;
  InOrder printer(items.size(), [&](std::size_t i) {
    if (options.timings && outcomes[i].ok) printTimings(items[i].model.path, outcomes[i].times);
    if (useBar || (quiet && outcomes[i].ok)) return;
    std::fprintf(stream, "%s\n", modelLine(i, items.size(), items[i], outcomes[i], options).c_str());
    std::fflush(stream);
  });
  runInParallel(
      items.size(), jobs, [&](std::size_t i) { outcomes[i] = foldOne(items[i], options, driverOptions); },
      [&](std::size_t i) {
        ++finishedCount;
        if (useBar) bar.update(finishedCount, items[i].model.path);
        printer.finished(i);
      });
  if (useBar) bar.clear();

  Counts total;
  std::vector<std::size_t> failed;
  for (std::size_t i = 0; i < items.size(); ++i) {
    total.add(outcomes[i].counts);
    if (!outcomes[i].ok) failed.push_back(i);
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  if (!quiet) {
    std::fprintf(stream, "%s%zu %s: %zu ok, %zu failed; %s; %s with %u jobs\n",
                 options.dryRun ? "dry run, nothing written: " : "", items.size(), items.size() == 1 ? "model" : "models",
                 items.size() - failed.size(),
                 failed.size(), total.text().c_str(), formatDuration(seconds).c_str(), jobs);
  }
  // Name the failures last, so they are the lines a user sees, even with -q or behind a progress bar.
  for (std::size_t i : failed)
    std::fprintf(stream, "failed: %s: %s\n", items[i].model.path.c_str(), outcomes[i].error.c_str());
  std::fflush(stream);
  if (failed.empty()) return kExitOk;
  // Only rewrites that failed --verify: exit code 1, as for one model; any unreadable or invalid model: 2.
  const bool onlyVerifyFailures =
      std::all_of(failed.begin(), failed.end(), [&](std::size_t i) { return outcomes[i].verifyFailed; });
  return onlyVerifyFailures ? kExitFindings : kExitInvalid;
}

int runFold(const FoldOptions& options) {
  const bool batchDestination = !options.outDir.empty() || options.inPlace;
  if (!options.output.empty() && batchDestination)
    throw Error("", "-o/--output names one output file; it cannot be combined with --out-dir or --in-place");
  if (!options.outDir.empty() && options.inPlace) throw Error("", "choose one of --out-dir and --in-place");
  if (!options.backupSuffix.empty() && !options.inPlace) throw Error("", "--backup-suffix only applies to --in-place");
  if (!options.output.empty()) {
    if (options.inputs.size() != 1)
      throw Error("", "-o/--output takes one input model; for several, use --out-dir DIR or --in-place");
    std::error_code ec;
    if (fs::is_directory(options.inputs.front(), ec))
      throw Error(options.inputs.front(), "this is a folder; -o/--output names one model file: use --out-dir DIR");
    if (!options.reportDir.empty()) throw Error("", "--report-dir is for several models; with -o use --report FILE");
    return runSingle(options);
  }
  if (!options.report.empty())
    throw Error("", "--report names one file; with --out-dir or --in-place each model gets its own report "
                    "(beside the model, or under --report-dir)");
  if (!batchDestination && !options.dryRun)
    throw Error("", "say where to write: -o/--output FILE for one model, --out-dir DIR or --in-place for many "
                    "(or --dry-run to only show what would be done)");
  return runBatch(options);
}

const char* kFoldFooter = R"(
Examples:
  bnfold fold model.onnx -o folded.onnx --report report.json
  bnfold fold models/ --out-dir folded/                 # mirrors models/, a .report.json beside each model
  bnfold fold a.onnx b.onnx models/ --out-dir out --report-dir reports --jobs 4
  bnfold fold models/ --in-place --backup-suffix .bak   # atomic replace, originals kept as *.onnx.bak
  bnfold fold models/ --dry-run                         # show what would be done, write nothing

With several models, each is processed independently: one that fails (unreadable, invalid) is named in the
final summary and makes the exit code 2, the others are still written. Per-model lines and the summary go to
stderr (a progress bar instead of the lines on a terminal); with --dry-run they go to stdout.

)";

}  // namespace

CommandRunner addFoldCommand(CLI::App& app) {
  auto options = std::make_shared<FoldOptions>();
  CLI::App* command = app.add_subcommand("fold", "Rewrite models and write the results and JSON reports");
  command->add_option("inputs", options->inputs,
                      "ONNX model files, or folders searched recursively for *.onnx (inputs are never modified, "
                      "except with --in-place)")
      ->required();
  command->add_option("-o,--output", options->output, "Where to write the rewritten model (one input); a file is replaced atomically, "
                      "a device or FIFO (/dev/stdout) is written into, a symbolic link's target is replaced");
  command->add_option("--report", options->report, "Write the JSON report here ('-' for stdout; one input)");
  command->add_option("--out-dir", options->outDir, "Write each model under DIR, mirroring the input layout")
      ->type_name("DIR");
  command->add_option("--report-dir", options->reportDir,
                      "Write each model's report under DIR (default: beside the written model)")
      ->type_name("DIR");
  command->add_flag("--in-place", options->inPlace, "Replace each input atomically (only when a rule changed it; regular files only)");
  command->add_option("--backup-suffix", options->backupSuffix,
                      "With --in-place, keep each original as <model><SUFFIX> (e.g. .bak)")
      ->type_name("SUFFIX");
  command->add_flag("--dry-run", options->dryRun, "Run the rules and show what would be written; write nothing");
  command->add_option("-j,--jobs", options->jobs, "Models processed in parallel (default: number of cores)")
      ->check(CLI::NonNegativeNumber);
  command->add_flag("--timings", options->timings,
                    "Print the wall time of loading, rules and saving to stderr (per model, even with -q)");
  addRuleFlags(*command, options->ruleFlags);
  command->footer(std::string(kFoldFooter) + ruleListText());
  return [options, &app] {
    options->quiet = app.count("--quiet") > 0;
    options->verbose = app.count("--verbose") > 0;
    return runFold(*options);
  };
}

}  // namespace bnfold::cli
