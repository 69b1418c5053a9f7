// bnfold._native: the C++ library under the Python package `bnfold` (python/bnfold/__init__.py is the public API).
// Every call into the library is in this file. The GIL is released while the library works; reports, findings and
// `info` become Python dicts and lists straight from their JSON trees (a report holds every folded BN's parameters,
// which as JSON text would cost more to print and parse than the fold).

#include <Python.h>
#include <sys/mman.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <cstring>
#include <exception>
#include <memory>
#include <new>
#include <set>
#include <string>
#include <vector>

#include "bnfold/api/api.h"
#include "bnfold/api/batch.h"
#include "bnfold/error.h"
#include "bnfold/io/atomic_file.h"
#include "bnfold/io/borrowed_model.h"
#include "bnfold/io/model_io.h"
#include "bnfold/version.h"

namespace py = pybind11;

namespace {

/// A failure to be raised as one of the module's exception classes; thrown with the GIL released, translated
/// after the GIL is back.
struct PythonFailure {
  enum class Kind { Error, InvalidModel, Option };
  Kind kind;
  std::string message;
};

/// Runs `work` without the GIL; library errors become PythonFailures.
template <typename Work>
auto withoutGil(Work&& work) -> decltype(work()) {
  try {
    py::gil_scoped_release release;
    return work();
  } catch (const bnfold::InvalidModelError& e) {
    throw PythonFailure{PythonFailure::Kind::InvalidModel, e.what()};
  } catch (const bnfold::Error& e) {
    throw PythonFailure{PythonFailure::Kind::Error, e.what()};
  } catch (const PythonFailure&) {
    throw;
  } catch (const py::error_already_set&) {
    throw;
  } catch (const std::bad_alloc&) {
    throw;
  } catch (const std::exception& e) {
    throw PythonFailure{PythonFailure::Kind::Error, e.what()};
  }
}

/// A folded model's bytes on their way into a ModelProto, which copies them: memory of its own, in huge pages where
/// the kernel grants them. A fresh 100 MB buffer of small pages spends most of its life in page faults (each first
/// touch is a trap; on a VM a slow one), which made fold(ModelProto) cost more than the fold itself.
class TransientBuffer {
 public:
  explicit TransientBuffer(std::size_t size) : size_(size), capacity_(std::max<std::size_t>(size, 1)) {
    void* mapped = mmap(nullptr, capacity_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (mapped == MAP_FAILED) throw std::bad_alloc();
    data_ = static_cast<char*>(mapped);
#ifdef MADV_HUGEPAGE
    madvise(mapped, capacity_, MADV_HUGEPAGE);  // advice only: where it is refused, small pages serve
#endif
  }
  ~TransientBuffer() { munmap(data_, capacity_); }
  TransientBuffer(const TransientBuffer&) = delete;
  TransientBuffer& operator=(const TransientBuffer&) = delete;

  char* data() { return data_; }
  std::size_t size() const { return size_; }

 private:
  std::size_t size_;
  std::size_t capacity_;
  char* data_ = nullptr;
};

/// The rule settings as the Python keywords give them (bnfold.fold documents each).
bnfold::DriverOptions driverOptions(const std::string& rules, const std::vector<std::string>& keep,
                                    const std::vector<std::string>& keepOp, bool inputDefaultsAreConstant,
                                    bool freezeTrainBn, bool equalize, double maxConstantMiB, bool verify,
                                    bool absorbHighBias, bool relu6ToRelu) {
  bnfold::RuleSettings settings;
  settings.rules = rules;
  settings.keepNodes = keep;
  settings.keepOps = keepOp;
  settings.inputDefaultsAreConstant = inputDefaultsAreConstant;
  settings.freezeTrainingBatchNorm = freezeTrainBn;
  settings.equalize = equalize;
  settings.absorbHighBias = absorbHighBias;
  settings.relu6ToRelu = relu6ToRelu;
  settings.maxConstantMiB = maxConstantMiB;
  settings.verify = verify;
  try {
    return bnfold::driverOptionsFrom(settings);
  } catch (const bnfold::Error& e) {
    throw PythonFailure{PythonFailure::Kind::Option, e.what()};
  }
}

py::object toPython(const nlohmann::json& value) {
  using Type = nlohmann::json::value_t;
  switch (value.type()) {
    case Type::boolean: return py::bool_(value.get<bool>());
    case Type::number_integer: return py::int_(value.get<int64_t>());
    case Type::number_unsigned: return py::int_(value.get<uint64_t>());
    case Type::number_float: return py::float_(value.get<double>());
    case Type::string: return py::str(value.get_ref<const std::string&>());
    case Type::array: {
      py::list list(value.size());
      std::size_t index = 0;
      for (const nlohmann::json& item : value) list[index++] = toPython(item);
      return std::move(list);
    }
    case Type::object: {
      py::dict dict;
      for (const auto& [key, item] : value.items()) dict[py::str(key)] = toPython(item);
      return std::move(dict);
    }
    default: return py::none();  // null (binary and discarded values do not occur in reports)
  }
}

std::vector<std::string> failureMessages(const bnfold::FoldRun& run) {
  std::vector<std::string> messages;
  for (const bnfold::Finding& failure : run.failedVerifications) messages.push_back(failure.message);
  return messages;
}

/// What every fold returns besides the model: the report as JSON, the verification failures (messages, and the
/// one-line summary the CLI prints) and the input-defaults hint.
/// `report.json()` must have been read once without the GIL, which turns its records into JSON.
py::dict runResult(const bnfold::Report& report, const bnfold::FoldRun& run) {
  py::dict result;
  result["report"] = toPython(report.json());
  result["verify_failures"] = failureMessages(run);
  result["verify_failure_text"] =
      run.failedVerifications.empty() ? std::string() : bnfold::verificationFailureText(run, report);
  result["input_defaults_hint"] = run.inputDefaultsHint;
  return result;
}

/// Folds a serialized ModelProto; the result dict has "model" (bytes, or None when a rewrite failed verification)
/// and, when `output` is given, the model saved there as `bnfold fold -o` saves it. With `transientModel`, "model" is
/// a TransientBuffer instead of bytes (for a caller that parses it into a ModelProto at once).
py::dict foldBytes(const py::bytes& data, const std::string& sourceName, const std::string& baseDir,
                   const std::string& output, const std::string& reportPath, const bnfold::DriverOptions& options,
                   bool dryRun, int64_t targetOpset, bool transientModel) {
  // Immutable, and kept alive by the caller while the GIL is released: the model borrows it, and is freed below.
  const std::string_view bytes = data;
  std::unique_ptr<bnfold::Model> model;
  bnfold::Report report;
  bnfold::FoldRun run;
  py::object modelBytes = py::none();
  std::unique_ptr<TransientBuffer> transient;
  const bool writes = !dryRun && !output.empty();
  withoutGil([&] {
    // Bad destinations fail before any work, as in the CLI.
    if (writes) bnfold::destinationOf(output);
    if (!reportPath.empty()) bnfold::destinationOf(reportPath);
    model = targetOpset > 0 ? bnfold::modelFromBytesAtOpset(bytes, sourceName, baseDir, targetOpset, &report)
                            : bnfold::modelFromBorrowedBytes(bytes, sourceName, baseDir);
    report.setInput(sourceName);
    if (!output.empty()) report.setOutput(output);
    run = bnfold::foldModel(*model, options, report);
    if (run.failedVerifications.empty() && !dryRun) {
      if (writes) bnfold::saveModel(*model, output);
      bnfold::serializeModel(*model, [&](std::size_t size) {
        if (transientModel) {
          transient = std::make_unique<TransientBuffer>(size);
          return transient->data();
        }
        py::gil_scoped_acquire acquire;
        PyObject* buffer = PyBytes_FromStringAndSize(nullptr, static_cast<Py_ssize_t>(size));
        if (!buffer) throw py::error_already_set();
        modelBytes = py::reinterpret_steal<py::object>(buffer);
        return PyBytes_AS_STRING(buffer);
      });
    }
    if (!reportPath.empty() && (!dryRun || !run.failedVerifications.empty())) {
      try {
        report.write(reportPath);
      } catch (...) {
        if (writes && run.failedVerifications.empty()) bnfold::removeWrittenFile(output);
        throw;
      }
    }
    report.json();
    model.reset();  // frees the IR without the GIL
  });
  py::dict result = runResult(report, run);
  result["model"] = transient ? py::cast(std::move(transient)) : modelBytes;
  return result;
}

/// `createFolders`: make the folders of `output` and `reportPath` when missing (a batch mirrors its inputs' layout).
py::dict foldPath(const std::string& input, const std::string& output, const std::string& reportPath, bool dryRun,
                  bool inPlace, const std::string& backupSuffix, const bnfold::DriverOptions& options,
                  bool createFolders, int64_t targetOpset) {
  bnfold::FoldFileRequest request;
  request.targetOpset = targetOpset;
  request.input = input;
  request.output = output;
  request.reportPath = reportPath;
  request.dryRun = dryRun;
  request.inPlace = inPlace;
  request.backupSuffix = backupSuffix;
  request.createFolders = createFolders;
  bnfold::FoldFileResult folded;
  withoutGil([&] {
    folded = bnfold::foldFile(request, options);
    folded.report.json();
    folded.model.reset();
  });
  py::dict result = runResult(folded.report, folded.run);
  result["written"] = folded.written;
  result["unchanged"] = folded.unchanged;
  result["timings"] = py::make_tuple(folded.times.load, folded.times.rules, folded.times.save);
  return result;
}

/// The models of a batch fold and where each goes: a list of (input, output, report), "" where nothing is written.
py::list planFoldBatch(const std::vector<std::string>& inputs, const std::string& outDir, const std::string& reportDir,
                       bool inPlace) {
  std::vector<bnfold::PlannedFold> planned;
  withoutGil([&] { planned = bnfold::planBatchFold(inputs, bnfold::BatchDestinations{outDir, reportDir, inPlace}); });
  py::list items;
  for (const bnfold::PlannedFold& item : planned) items.append(py::make_tuple(item.model.path, item.output, item.report));
  return items;
}

/// A model to read: a serialized ModelProto (`bytes`) or a file (`path`). Taken from the Python object while the
/// GIL is held; the bytes object is immutable and outlives the call, so the model borrows it (it is freed before
/// the call returns).
struct ModelSource {
  explicit ModelSource(const py::object& source) {
    if (py::isinstance<py::bytes>(source)) {
      inMemory = true;
      bytes = source.cast<std::string_view>();
    } else {
      path = source.cast<std::string>();
    }
  }
  std::unique_ptr<bnfold::Model> load(const std::string& sourceName, const std::string& baseDir,
                                      const bnfold::LoadOptions& loadOptions) const {
    return load(sourceName, baseDir, loadOptions, 0, nullptr);
  }
  /// With targetOpset > 0 the model is converted first (bnfold::loadModelAtOpset), recorded in `report`.
  std::unique_ptr<bnfold::Model> load(const std::string& sourceName, const std::string& baseDir,
                                      const bnfold::LoadOptions& loadOptions, int64_t targetOpset,
                                      bnfold::Report* report) const {
    if (targetOpset > 0)
      return inMemory ? bnfold::modelFromBytesAtOpset(bytes, sourceName, baseDir, targetOpset, report)
                      : bnfold::loadModelAtOpset(path, targetOpset, report);
    if (inMemory) return bnfold::modelFromBorrowedBytes(bytes, sourceName, baseDir, loadOptions);
    return bnfold::loadModel(path, loadOptions);
  }
  bool inMemory = false;
  std::string_view bytes;
  std::string path;
};

/// The findings `bnfold check` prints for one model, as a list of dicts.
py::object checkModel(const py::object& source, const std::string& sourceName, const std::string& baseDir,
                       const std::string& failOnText, const bnfold::DriverOptions& options, int64_t targetOpset) {
  std::set<std::string> failOn;
  try {
    failOn = bnfold::parseFailOn(failOnText);
  } catch (const bnfold::Error& e) {
    throw PythonFailure{PythonFailure::Kind::Option, e.what()};
  }
  const ModelSource modelSource(source);
  nlohmann::json findings = nlohmann::json::array();
  withoutGil([&] {
    bnfold::Report report;
    std::unique_ptr<bnfold::Model> model = modelSource.load(sourceName, baseDir, {}, targetOpset, &report);
    report.setInput(sourceName);
    bnfold::foldModel(*model, options, report);  // rewrites in memory only; nothing is saved
    for (const bnfold::Finding& finding : bnfold::findingsOf(*model, report, failOn, options.ruleOptions)) {
      auto orNull = [](const std::string& text) { return text.empty() ? nlohmann::json() : nlohmann::json(text); };
      findings.push_back({{"category", finding.category},
                          {"severity", bnfold::severityName(finding.severity)},
                          {"node", orNull(finding.node)},
                          {"message", finding.message},
                          {"op", orNull(finding.op)},
                          {"graph", orNull(finding.graph)},
                          {"rule", orNull(finding.rule)},
                          {"reason", orNull(finding.reason)},
                          {"entry", finding.entry}});
    }
  });
  return toPython(findings);
}

/// `bnfold info --json`; with `weightsOptions`, `info --weights --json` folding with those options.
py::object describe(const py::object& source, const std::string& sourceName, const std::string& baseDir,
                    const bnfold::DriverOptions* weightsOptions) {
  const ModelSource modelSource(source);
  nlohmann::json info;
  withoutGil([&] {
    bnfold::LoadOptions loadOptions;
    loadOptions.nameUnnamedNodes = weightsOptions != nullptr;  // as `bnfold info`
    std::unique_ptr<bnfold::Model> model = modelSource.load(sourceName, baseDir, loadOptions);
    info = bnfold::describeModel(*model);
    if (weightsOptions)
      info["weights"] = bnfold::weightQuantJson(bnfold::summarizeWeightQuant(*model, *weightsOptions));
  });
  return toPython(info);
}

}  // namespace

PYBIND11_MODULE(_native, m) {
  m.doc() = "The C++ core of bnfold; use the functions of the `bnfold` package.";
  m.attr("__version__") = bnfold::kVersion;

  // The exception classes live as long as the process (plain references: no destructor runs after the
  // interpreter has gone). bnfold/__init__.py re-exports them.
  static PyObject* errorType = PyErr_NewExceptionWithDoc(
      "bnfold.Error", "A bnfold failure; str(error) is the line the CLI prints after 'bnfold: error: '.",
      PyExc_Exception, nullptr);
  static PyObject* invalidModelType = PyErr_NewExceptionWithDoc(
      "bnfold.InvalidModelError", "The model cannot be read or is not a valid ONNX model.", errorType, nullptr);
  // Bad keyword values are also ValueErrors, as Python callers expect.
  static PyObject* optionType = PyErr_NewExceptionWithDoc(
      "bnfold.OptionError", "A keyword argument has a bad value (also a ValueError).",
      py::make_tuple(py::handle(errorType), py::handle(PyExc_ValueError)).ptr(), nullptr);
  if (!errorType || !invalidModelType || !optionType) throw py::error_already_set();
  m.add_object("Error", py::handle(errorType));
  m.add_object("InvalidModelError", py::handle(invalidModelType));
  m.add_object("OptionError", py::handle(optionType));
  py::register_exception_translator([](std::exception_ptr thrown) {
    try {
      if (thrown) std::rethrow_exception(thrown);
    } catch (const PythonFailure& failure) {
      PyObject* type = failure.kind == PythonFailure::Kind::InvalidModel ? invalidModelType
                       : failure.kind == PythonFailure::Kind::Option    ? optionType
                                                                        : errorType;
      PyErr_SetString(type, failure.message.c_str());
    }
  });

  m.def("driver_options", &driverOptions, py::arg("rules"), py::arg("keep"), py::arg("keep_op"),
        py::arg("input_defaults_are_constant"), py::arg("freeze_train_bn"), py::arg("equalize"),
        py::arg("max_constant_size"),
        py::arg("verify"), py::arg("absorb_high_bias"), py::arg("relu6_to_relu"));
  py::class_<TransientBuffer>(m, "TransientBuffer", py::buffer_protocol(),
                              "A folded model's bytes, read-only, to be parsed into a ModelProto and dropped.")
      .def_buffer([](TransientBuffer& buffer) {
        return py::buffer_info(buffer.data(), 1, py::format_descriptor<unsigned char>::format(), 1,
                               {static_cast<py::ssize_t>(buffer.size())}, {1}, /*readonly=*/true);
      })
      .def("__len__", &TransientBuffer::size);
  py::class_<bnfold::DriverOptions>(m, "DriverOptions", "Validated rule settings (from driver_options).")
      .def_property(
          "concurrent", [](const bnfold::DriverOptions& options) { return options.ruleOptions.concurrent; },
          [](bnfold::DriverOptions& options, bool concurrent) { options.ruleOptions.concurrent = concurrent; },
          "Whether a rule may use a second thread (fold_many turns it off when it folds models at once).");
  m.def("fold_bytes", &foldBytes, py::arg("data"), py::arg("source_name"), py::arg("base_dir"), py::arg("output"),
        py::arg("report"), py::arg("options"), py::arg("dry_run"), py::arg("target_opset") = 0, py::arg("transient_model") = false);
  m.def("fold_path", &foldPath, py::arg("input"), py::arg("output"), py::arg("report"), py::arg("dry_run"),
        py::arg("in_place"), py::arg("backup_suffix"), py::arg("options"), py::arg("create_folders") = false,
        py::arg("target_opset") = 0);
  m.def("plan_fold_batch", &planFoldBatch, py::arg("inputs"), py::arg("out_dir"), py::arg("report_dir"),
        py::arg("in_place"));
  m.def("check", &checkModel, py::arg("source"), py::arg("source_name"), py::arg("base_dir"), py::arg("fail_on"),
        py::arg("options"), py::arg("target_opset") = 0);
  m.def("info", &describe, py::arg("source"), py::arg("source_name"), py::arg("base_dir"),
        py::arg("weights_options") = nullptr);
  m.def("rules", [] {
    py::list rules;
    for (const auto& rule : bnfold::builtinRules())
      rules.append(py::make_tuple(rule->name(), rule->summary(), rule->enabledByDefault()));
    return rules;
  });
  m.def("finding_categories", [] {
    py::list categories;
    for (const bnfold::FindingCategory& category : bnfold::findingCategories())
      categories.append(py::make_tuple(category.name, category.meaning));
    return categories;
  });
  m.attr("default_fail_on") = bnfold::kDefaultFailOn;
}
