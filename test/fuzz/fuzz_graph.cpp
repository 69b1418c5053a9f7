// Structure-aware libFuzzer target: inputs are serialized ONNX models, mutated at the graph level
// (model_mutator.cpp). Each input: load into the IR -> every rule -> save -> reload the saved file.
// A bnfold::Error on load is the expected answer to a bad model. Once a model has loaded, the rules must run,
// the IR must stay consistent (Graph::verify), and the rewritten model must save and load again: anything else,
// like any crash or sanitizer report, is a finding.

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <string>

#include <onnx/defs/parser.h>
#include <onnx/onnx_pb.h>

#include "bnfold/error.h"
#include "bnfold/io/model_io.h"
#include "bnfold/report/report.h"
#include "bnfold/check/fold.h"
#include "fuzz_support.h"
#include "model_mutator.h"

extern "C" std::size_t LLVMFuzzerMutate(uint8_t* data, std::size_t size, std::size_t maxSize);

namespace {

// What the mutator starts from when the input does not parse as a ModelProto: a Conv -> BN -> Relu and a
// Gemm -> BN -> Add with BN parameters that are neither 0 nor 1, so the first mutations already reach the rules.
constexpr const char* kFallbackModelText = R"(<ir_version: 8, opset_import: ["" : 15]>
fallback (float[N,2,3,3] x, float[N,4] h) => (float[N,3,3,3] y, float[N,2] z)
<float[3,2,1,1] w = {0.5, -1.0, 0.25, 2.0, -0.75, 1.5},
 float[3] s = {1.5, -0.5, 2.0}, float[3] b = {0.1, 0.2, -0.3}, float[3] m = {0.05, -0.1, 0.2},
 float[3] v = {0.9, 1.1, 0.3},
 float[2,4] gw = {1.0, 2.0, -1.0, 0.5, 0.25, -0.5, 1.5, 3.0}, float[2] gc = {0.5, -0.5},
 float[2] gs = {2.0, 0.5}, float[2] gb = {0.0, 1.0}, float[2] gm = {0.1, 0.2}, float[2] gv = {1.5, 0.25},
 float[2] bias = {0.3, -0.3}>
{
  c = Conv <kernel_shape = [1, 1], pads = [0, 0, 0, 0], strides = [1, 1]> (x, w)
  n = BatchNormalization <epsilon = 0.001> (c, s, b, m, v)
  y = Relu (n)
  g = Gemm <transB = 1, alpha = 1.0, beta = 1.0> (h, gw, gc)
  gn = BatchNormalization (g, gs, gb, gm, gv)
  z = Add (gn, bias)
}
)";

const onnx::ModelProto& fallbackModel() {
  static const onnx::ModelProto model = [] {
    onnx::ModelProto proto;
    const auto status = onnx::OnnxParser::Parse(proto, kFallbackModelText);
    if (!status.IsOK()) bnfold::fuzz::reportFinding("setup", "fallback model: " + status.ErrorMessage());
    return proto;
  }();
  return model;
}

void verifyGraphs(bnfold::Model& model, const char* stage) {
  try {
    for (bnfold::Graph* graph : model.allGraphs()) graph->verify();
  } catch (const std::exception& e) {
    bnfold::fuzz::reportFinding(stage, std::string("inconsistent IR: ") + e.what());
  }
}

}  // namespace

extern "C" std::size_t LLVMFuzzerCustomMutator(uint8_t* data, std::size_t size, std::size_t maxSize,
                                              unsigned int seed) {
  onnx::ModelProto model;
  if (size > bnfold::fuzz::kMaxInputBytes || !model.ParseFromArray(data, static_cast<int>(size)))
    model = fallbackModel();
  bnfold::fuzz::mutateModel(model, seed, LLVMFuzzerMutate);
  std::string bytes;
  if (!model.SerializeToString(&bytes) || bytes.size() > maxSize) {
    // Grew past -max_len: start again from the fallback model, which always fits.
    model = fallbackModel();
    bnfold::fuzz::mutateModel(model, seed, LLVMFuzzerMutate);
    if (!model.SerializeToString(&bytes) || bytes.size() > maxSize) return size;
  }
  std::memcpy(data, bytes.data(), bytes.size());
  return bytes.size();
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  using namespace bnfold;
  if (size > fuzz::kMaxInputBytes) return -1;  // -1: never added to the corpus
  const fuzz::ScratchDir& dir = fuzz::ScratchDir::get();
  dir.writeInput(data, size);
  std::unique_ptr<Model> model;
  try {
    model = loadModel(dir.inputPath());
  } catch (const Error&) {
    return 0;  // rejected as bad input: expected
  } catch (const std::exception& e) {
    fuzz::reportFinding("load", std::string("unexpected exception: ") + e.what());
  }
  verifyGraphs(*model, "load");
  try {
    Report report;
    report.setReorderedGraphs(model->reorderedGraphs());
    runRules(*model, fuzz::driverOptionsFor(data, size), report);
    (void)report.dump();
  } catch (const std::exception& e) {
    fuzz::reportFinding("rules", std::string("a loaded model failed in the rules: ") + e.what());
  }
  verifyGraphs(*model, "rules");
  try {
    saveModel(*model, dir.outputPath());
  } catch (const std::exception& e) {
    fuzz::reportFinding("save", std::string("a loaded, rewritten model did not save: ") + e.what());
  }
  model.reset();
  try {
    model = loadModel(dir.outputPath());
  } catch (const std::exception& e) {
    fuzz::reportFinding("reload", std::string("the saved model does not load: ") + e.what());
  }
  verifyGraphs(*model, "reload");
  return 0;
}
