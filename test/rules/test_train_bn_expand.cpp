// train-bn-expand: training-mode BatchNormalization expanded into primitive ops, in the form valid at each opset,
// checked for structure (ONNX text models) and numerically (ONNX Runtime running the original op, ONNX's own
// backend test data, and a numpy reference where ONNX Runtime cannot run the original).

#include <onnx/checker.h>
#include <onnx/shape_inference/implementation.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <set>

#include "bnfold/rewrite/rewriter.h"
#include "rules/opset_emit.h"
#include "test_support.h"

using namespace bnfold;
using namespace bnfold::test;

namespace {

constexpr const char* kRule = "train-bn-expand";

std::string join(const std::vector<int64_t>& values) {
  std::string text;
  for (std::size_t i = 0; i < values.size(); ++i) text += (i ? "," : "") + std::to_string(values[i]);
  return text;
}

std::string listText(const std::vector<double>& values) {
  std::string text;
  char buffer[40];
  for (std::size_t i = 0; i < values.size(); ++i) {
    std::snprintf(buffer, sizeof buffer, "%.9g", values[i]);
    text += (i ? ", " : "") + std::string(buffer);
  }
  return text;
}

// Per-channel parameters: scales of both signs, non-zero means, variances apart from 1.
std::vector<double> scaleValues(int64_t channels) {
  std::vector<double> v;
  for (int64_t c = 0; c < channels; ++c) v.push_back((c % 2 ? -0.75 : 1.25) + 0.125 * static_cast<double>(c));
  return v;
}
std::vector<double> biasValues(int64_t channels) {
  std::vector<double> v;
  for (int64_t c = 0; c < channels; ++c) v.push_back(0.25 * static_cast<double>(c) - 0.375);
  return v;
}
std::vector<double> meanValues(int64_t channels) {
  std::vector<double> v;
  for (int64_t c = 0; c < channels; ++c) v.push_back(0.0625 * static_cast<double>(c) - 0.125);
  return v;
}
std::vector<double> varValues(int64_t channels) {
  std::vector<double> v;
  for (int64_t c = 0; c < channels; ++c) v.push_back(0.5 + 0.375 * static_cast<double>(c));
  return v;
}

// One BatchNormalization model in ONNX text, written with float tensors (retyped by parseAs).
struct BnCase {
  int64_t opset = 15;
  std::vector<int64_t> dims{2, 3, 4, 5};
  std::string attributes = "training_mode = 1";
  std::vector<std::string> nodeOutputs{"y", "running_mean", "running_var"};
  std::vector<std::string> graphOutputs{"y", "running_mean", "running_var"};
  bool paramsAsInputs = false;   // scale, bias, mean, var fed at run time instead of initializers
  bool emptyStatistics = false;  // mean and var are empty tensors
  std::string extraNodes;        // more nodes after the BN (may read its outputs)
};

int64_t channelsOf(const BnCase& c) { return c.dims[1]; }

std::string modelText(const BnCase& c) {
  const int64_t channels = channelsOf(c);
  const std::string x = "float[" + join(c.dims) + "]";
  const std::string vec = "float[" + std::to_string(channels) + "]";
  const std::string stats = c.emptyStatistics ? "float[0]" : vec;
  std::string inputs = x + " x";
  std::string initializers;
  auto param = [&](const std::string& type, const std::string& name, const std::vector<double>& values) {
    if (c.paramsAsInputs) {
      inputs += ", " + type + " " + name;
    } else {
      initializers += (initializers.empty() ? "" : ", ") + type + " " + name + " = {" + listText(values) + "}";
    }
  };
  param(vec, "scale", scaleValues(channels));
  param(vec, "bias", biasValues(channels));
  param(stats, "mean", c.emptyStatistics ? std::vector<double>{} : meanValues(channels));
  param(stats, "var", c.emptyStatistics ? std::vector<double>{} : varValues(channels));
  std::string outputs;
  for (const std::string& name : c.graphOutputs) {
    const bool perChannel = name != "y" && name != "r";
    outputs += (outputs.empty() ? "" : ", ") + (perChannel ? vec : x) + " " + name;
  }
  std::string nodeOutputs;
  for (const std::string& name : c.nodeOutputs) nodeOutputs += (nodeOutputs.empty() ? "" : ", ") + name;
  const std::string attributes = c.attributes.empty() ? "" : " <" + c.attributes + ">";
  return "<ir_version: 8, opset_import: [\"\" : " + std::to_string(c.opset) + "]>\n" + "bn_graph (" + inputs +
         ") => (" + outputs + ")\n" + (initializers.empty() ? "" : "<" + initializers + ">\n") + "{\n  " + nodeOutputs +
         " = BatchNormalization" + attributes + " (x, scale, bias, mean, var)\n" + c.extraNodes + "}\n";
}

// Parses ONNX text stated with float tensors and turns every float tensor and declared type into `type`, except
// the names in `keepFloat` (libonnx 1.12's text parser cannot write float16 or bfloat16 literals).
std::unique_ptr<Model> parseAs(const std::string& text, DataType type, const std::set<std::string>& keepFloat = {},
                               const std::function<void(onnx::ModelProto&)>& tweak = {}) {
  onnx::ModelProto proto = parseModelProto(text);
  auto* graph = proto.mutable_graph();
  const auto retype = [&](onnx::ValueInfoProto& info) {
    auto* tensorType = info.mutable_type()->mutable_tensor_type();
    if (tensorType->elem_type() == onnx::TensorProto::FLOAT && !keepFloat.count(info.name()))
      tensorType->set_elem_type(static_cast<int32_t>(type));
  };
  if (type != DataType::Float) {
    for (auto& info : *graph->mutable_input()) retype(info);
    for (auto& info : *graph->mutable_output()) retype(info);
    for (auto& info : *graph->mutable_value_info()) retype(info);
    for (auto& initializer : *graph->mutable_initializer()) {
      if (initializer.data_type() != onnx::TensorProto::FLOAT || keepFloat.count(initializer.name())) continue;
      const Tensor original(std::make_unique<onnx::TensorProto>(initializer));
      initializer = Tensor::fromDoubles(initializer.name(), type, original.dims(), original.toDoubles()).proto();
    }
  }
  if (tweak) tweak(proto);
  return modelFromProto(std::move(proto), "<onnx text>", ".");
}

std::unique_ptr<Model> parseCase(const BnCase& c, DataType type = DataType::Float) {
  return parseAs(modelText(c), type);
}

// Tolerances (atol = rtol) for comparing with ONNX Runtime's own BatchNormalization kernel: about ten units in the
// last place for float and double (measured: 5e-7 and 1e-15 at most), one float16 ulp at 1.0 for float16 (ONNX
// Runtime runs the float16 op as the same primitive ops and matches bit for bit here).
double toleranceFor(DataType type) {
  switch (type) {
    case DataType::Double:
      return 1e-12;
    case DataType::Float16:
      return std::ldexp(1.0, -10);
    default:
      return 1e-5;
  }
}

std::vector<const Node*> nodesOf(const Graph& graph, const std::string& opType) {
  std::vector<const Node*> found;
  for (const auto& node : graph.nodes())
    if (node->opType() == opType) found.push_back(node.get());
  return found;
}

const Node* producerOf(const Graph& graph, const std::string& valueName) {
  const Value* value = graph.findLocal(valueName);
  return value ? value->producer() : nullptr;
}

std::vector<std::string> graphOutputNames(const Graph& graph) {
  std::vector<std::string> names;
  for (const auto& entry : graph.outputs()) names.push_back(entry.value->name());
  return names;
}

std::vector<double> valuesOf(const Value* value) {
  REQUIRE(value);
  REQUIRE(value->initializer());
  return value->initializer()->toDoubles();
}

std::vector<double> roundedToFloat(std::vector<double> values) {
  for (double& v : values) v = static_cast<double>(static_cast<float>(v));
  return values;
}

// The axes of a ReduceMean/Squeeze/Unsqueeze, wherever the opset puts them.
std::vector<int64_t> axesOf(const Node& node) {
  if (node.hasAttribute("axes")) return node.attributeInts("axes");
  REQUIRE(node.input(1));
  REQUIRE(node.input(1)->initializer());
  return node.input(1)->initializer()->toInt64s();
}

const nlohmann::json& onlyEntry(const Report& report, const std::string& section) {
  const auto& entries = report.section(section);
  REQUIRE(entries.size() == 1);
  return entries[0];
}

bool hasTrainingBatchNorm(Model& model) {
  for (Graph* graph : model.allGraphs())
    for (const auto& node : graph->nodes())
      if (node->opType() == "BatchNormalization") return true;
  return false;
}

// onnx::checker, then strict shape inference with type checks (libonnx knows opsets up to 17). The opset-1
// versions of Sub and Mul have no type inference in libonnx, so opset 1 gets the checker only.
void checkWithOnnx(Model& model) {
  onnx::ModelProto proto = modelToProto(model);
  CHECK_NOTHROW(onnx::checker::check_model(proto));
  if (model.opsetVersion("") > 1)
    CHECK_NOTHROW(onnx::shape_inference::InferShapes(proto, onnx::OpSchemaRegistry::Instance(),
                                                     onnx::ShapeInferenceOptions(true, 1)));
}

const std::string kFullSequence =
    "ReduceMean,Sub,Mul,ReduceMean,Add,Sqrt,Div,Mul,Add,Squeeze,Mul,Mul,Add,Squeeze,Mul,Mul,Add";

}  // namespace

TEST_CASE("train-bn-expand: opset 15, 4-D, constant params: emitted structure and constants", "[train-bn-expand]") {
  BnCase c;
  c.attributes = "training_mode = 1, epsilon = 0.001, momentum = 0.8";
  auto model = parseCase(c);
  auto outcome = applyRulesAndCompare(*model, {kRule}, 1e-5, 1e-5);
  INFO(outcome.comparison.error);
  CHECK(outcome.comparison.ok);
  const Graph& graph = model->graph();
  CHECK(opSequence(graph) == kFullSequence);
  CHECK(graphOutputNames(graph) == std::vector<std::string>{"y", "running_mean", "running_var"});

  // Statistics over N, H, W with kept dims; axes as an attribute before opset 18.
  for (const Node* reduce : nodesOf(graph, "ReduceMean")) {
    CHECK(reduce->inputs().size() == 1);
    CHECK(reduce->attributeInts("axes") == std::vector<int64_t>{0, 2, 3});
    CHECK(reduce->attributeInt("keepdims", -1) == 1);
  }
  // Squeeze takes its axes as an input from opset 13.
  for (const Node* squeeze : nodesOf(graph, "Squeeze")) {
    CHECK_FALSE(squeeze->hasAttribute("axes"));
    CHECK(axesOf(*squeeze) == std::vector<int64_t>{0, 2, 3});
  }
  // scale and B as [C, 1, 1] initializers (a [C] one would broadcast over W).
  const Node* output = producerOf(graph, "y");
  REQUIRE(output);
  CHECK(output->opType() == "Add");
  const Value* bias = output->input(1);
  CHECK(bias->initializer()->dims() == std::vector<int64_t>{3, 1, 1});
  CHECK(valuesOf(bias) == roundedToFloat(biasValues(3)));
  const Node* scaled = output->input(0)->producer();
  REQUIRE(scaled->opType() == "Mul");
  CHECK(scaled->input(1)->initializer()->dims() == std::vector<int64_t>{3, 1, 1});
  CHECK(valuesOf(scaled->input(1)) == roundedToFloat(scaleValues(3)));
  const Node* divide = scaled->input(0)->producer();
  REQUIRE(divide->opType() == "Div");
  const Node* sqrt = divide->input(1)->producer();
  REQUIRE(sqrt->opType() == "Sqrt");
  const Node* addEpsilon = sqrt->input(0)->producer();
  CHECK(addEpsilon->input(1)->initializer()->dims().empty());
  CHECK(valuesOf(addEpsilon->input(1)) == std::vector<double>{static_cast<float>(0.001)});
  // running_mean = mean * 0.8 + batch_mean * (1 - 0.8), in float like the op's attribute.
  const Node* runningMean = producerOf(graph, "running_mean");
  REQUIRE(runningMean->opType() == "Add");
  const Node* kept = runningMean->input(0)->producer();
  const Node* added = runningMean->input(1)->producer();
  CHECK(kept->input(0)->name() == "mean");
  CHECK(valuesOf(kept->input(1)) == std::vector<double>{static_cast<float>(0.8)});
  CHECK(valuesOf(added->input(1)) == std::vector<double>{static_cast<float>(1.0 - static_cast<double>(0.8f))});
  CHECK(added->input(0)->producer()->opType() == "Squeeze");
  CHECK(producerOf(graph, "running_var")->input(0)->producer()->input(0)->name() == "var");

  const auto& entry = onlyEntry(outcome.report, "expanded");
  CHECK(entry["rule"] == kRule);
  CHECK(entry["node"] == "BatchNormalization_0");
  CHECK(entry["form"] == "opset-15 (training_mode)");
  CHECK(entry["outputs"] == nlohmann::json{"y", "running_mean", "running_var"});
  CHECK(entry["emitted"].size() == graph.nodeCount());
  CHECK(outcome.report.section("skipped").empty());
  checkWithOnnx(*model);
}

TEST_CASE("train-bn-expand: opset 18 and 21 give ReduceMean its axes as an input", "[train-bn-expand]") {
  for (int64_t opset : {18, 21}) {
    CAPTURE(opset);
    BnCase c;
    c.opset = opset;
    auto model = parseCase(c);
    auto outcome = applyRulesAndCompare(*model, {kRule}, 1e-5, 1e-5);
    INFO(outcome.comparison.error);
    CHECK(outcome.comparison.ok);
    const Graph& graph = model->graph();
    CHECK(opSequence(graph) == kFullSequence);
    for (const Node* reduce : nodesOf(graph, "ReduceMean")) {
      CHECK_FALSE(reduce->hasAttribute("axes"));
      REQUIRE(reduce->inputs().size() == 2);
      CHECK(reduce->input(1)->initializer()->dataType() == DataType::Int64);
      CHECK(axesOf(*reduce) == std::vector<int64_t>{0, 2, 3});
    }
    for (const Node* squeeze : nodesOf(graph, "Squeeze")) CHECK(axesOf(*squeeze).size() == 3);
    CHECK(onlyEntry(outcome.report, "expanded")["form"] == "opset-15 (training_mode)");
  }
}

TEST_CASE("train-bn-expand: opset 14 and 13 boundaries of Squeeze and ReduceMean forms", "[train-bn-expand]") {
  BnCase c;
  c.opset = 14;
  auto model = parseCase(c);
  auto outcome = applyRulesAndCompare(*model, {kRule}, 1e-5, 1e-5);
  INFO(outcome.comparison.error);
  CHECK(outcome.comparison.ok);
  for (const Node* reduce : nodesOf(model->graph(), "ReduceMean")) CHECK(reduce->hasAttribute("axes"));
  for (const Node* squeeze : nodesOf(model->graph(), "Squeeze")) CHECK(squeeze->inputs().size() == 2);
  CHECK(onlyEntry(outcome.report, "expanded")["form"] == "opset-14 (training_mode)");
  checkWithOnnx(*model);
}

TEST_CASE("train-bn-expand: opsets 7 and 9 with all five outputs, saved_var is the inverse std", "[train-bn-expand]") {
  for (int64_t opset : {7, 9}) {
    CAPTURE(opset);
    BnCase c;
    c.opset = opset;
    c.attributes = "epsilon = 0.01, momentum = 0.7";
    c.nodeOutputs = {"y", "running_mean", "running_var", "saved_mean", "saved_var"};
    c.graphOutputs = c.nodeOutputs;
    auto model = parseCase(c);
    // ONNX Runtime's opset 7/9 kernel outputs the batch mean and 1/sqrt(batch var + epsilon): the comparison
    // checks the meaning docs/training-bn.md gives them.
    auto outcome = applyRulesAndCompare(*model, {kRule}, 1e-5, 1e-5);
    INFO(outcome.comparison.error);
    CHECK(outcome.comparison.ok);
    CHECK(outcome.comparison.details["outputs"].size() == 5);
    const Graph& graph = model->graph();
    CHECK(opSequence(graph) == kFullSequence + ",Squeeze,Reciprocal,Squeeze");
    // Squeeze takes axes as an attribute before opset 13.
    for (const Node* squeeze : nodesOf(graph, "Squeeze"))
      CHECK(squeeze->attributeInts("axes") == std::vector<int64_t>{0, 2, 3});
    CHECK(producerOf(graph, "saved_var")->input(0)->producer()->opType() == "Reciprocal");
    CHECK(graphOutputNames(graph) == c.nodeOutputs);
    const auto& entry = onlyEntry(outcome.report, "expanded");
    CHECK(entry["form"] == (opset == 7 ? "opset-7" : "opset-9"));
    CHECK(entry["cause"] == "optional outputs present");
    checkWithOnnx(*model);
  }
}

TEST_CASE("train-bn-expand: opsets 1 and 6 use legacy broadcast attributes (structure only)", "[train-bn-expand]") {
  // ONNX Runtime has no kernels below opset 7, so these forms are checked for structure and by onnx::checker with
  // shape inference, not numerically.
  for (int64_t opset : {1, 6}) {
    CAPTURE(opset);
    BnCase c;
    c.opset = opset;
    c.attributes = opset == 1 ? "is_test = 0, consumed_inputs = [0, 0, 0, 1, 1]" : "is_test = 0";
    c.nodeOutputs = {"y", "running_mean", "running_var", "saved_mean", "saved_var"};
    c.graphOutputs = c.nodeOutputs;
    auto model = parseCase(c);
    checkWithOnnx(*model);
    Report report = applyRules(*model, {kRule});
    const Graph& graph = model->graph();
    CHECK(opSequence(graph) ==
          "ReduceMean,Sub,Mul,ReduceMean,Add,Sqrt,Div,Mul,Add,Mul,Mul,Add,Mul,Mul,Add,Identity,Reciprocal");
    // Statistics come out as [C] (keepdims 0) and are aligned at axis 1 by broadcast=1, axis=1.
    for (const Node* reduce : nodesOf(graph, "ReduceMean")) {
      CHECK(reduce->attributeInts("axes") == std::vector<int64_t>{0, 2, 3});
      CHECK(reduce->attributeInt("keepdims", -1) == 0);
    }
    const Node* output = producerOf(graph, "y");
    CHECK(output->input(1)->name() == "bias");  // the original [C] vector, aligned by axis=1
    CHECK(output->attributeInt("broadcast", 0) == 1);
    CHECK(output->attributeInt("axis", -1) == 1);
    const Node* scaled = output->input(0)->producer();
    CHECK(scaled->input(1)->name() == "scale");
    CHECK(scaled->attributeInt("axis", -1) == 1);
    const Node* centered = nodesOf(graph, "Sub").at(0);
    CHECK(centered->attributeInt("broadcast", 0) == 1);
    CHECK(centered->attributeInt("axis", -1) == 1);
    // Scalars broadcast without an axis; same-shape operands need no attribute.
    const Node* addEpsilon =
        producerOf(graph, "y")->input(0)->producer()->input(0)->producer()->input(1)->producer()->input(0)->producer();
    REQUIRE(addEpsilon->opType() == "Add");
    CHECK(addEpsilon->attributeInt("broadcast", 0) == 1);
    CHECK_FALSE(addEpsilon->hasAttribute("axis"));
    CHECK_FALSE(producerOf(graph, "running_mean")->hasAttribute("broadcast"));
    CHECK(producerOf(graph, "saved_mean")->opType() == "Identity");
    CHECK(producerOf(graph, "saved_var")->opType() == "Reciprocal");
    CHECK(graphOutputNames(graph) == c.nodeOutputs);
    CHECK(onlyEntry(report, "expanded")["cause"] == "is_test=0");
    checkWithOnnx(*model);
  }
}

TEST_CASE("train-bn-expand: ranks 2-5 x float/double/float16 x opsets 14/15/18 match ONNX Runtime",
          "[train-bn-expand][ort]") {
  const std::vector<std::vector<int64_t>> shapes{{6, 3}, {2, 3, 5}, {2, 3, 4, 5}, {2, 3, 2, 3, 4}};
  for (int64_t opset : {14, 15, 18}) {
    for (DataType type : {DataType::Float, DataType::Double, DataType::Float16}) {
      for (const auto& dims : shapes) {
        CAPTURE(opset, dataTypeName(type), dims);
        BnCase c;
        c.opset = opset;
        c.dims = dims;
        c.attributes = "training_mode = 1, epsilon = 0.0001, momentum = 0.75";
        auto model = parseCase(c, type);
        auto outcome = applyRulesAndCompare(*model, {kRule}, toleranceFor(type), toleranceFor(type));
        INFO(outcome.comparison.error);
        CHECK(outcome.comparison.ok);
        CHECK_FALSE(hasTrainingBatchNorm(*model));
        CHECK(outcome.report.section("expanded").size() == 1);
        CHECK(graphOutputNames(model->graph()) == std::vector<std::string>{"y", "running_mean", "running_var"});
        // Constants are in the BN's type.
        for (const Value* init : model->graph().initializers())
          if (init->initializer()->dataType() != DataType::Int64) CHECK(init->initializer()->dataType() == type);
      }
    }
  }
}

TEST_CASE("train-bn-expand: 2-D input uses the [C] parameters as they are", "[train-bn-expand]") {
  BnCase c;
  c.dims = {5, 4};
  auto model = parseCase(c);
  auto outcome = applyRulesAndCompare(*model, {kRule}, 1e-5, 1e-5);
  INFO(outcome.comparison.error);
  CHECK(outcome.comparison.ok);
  const Graph& graph = model->graph();
  const Node* output = producerOf(graph, "y");
  CHECK(output->input(1)->name() == "bias");
  CHECK(output->input(0)->producer()->input(1)->name() == "scale");
  for (const Node* reduce : nodesOf(graph, "ReduceMean"))
    CHECK(reduce->attributeInts("axes") == std::vector<int64_t>{0});
}

TEST_CASE("train-bn-expand: parameters fed at run time are unsqueezed to [C, 1, ...]", "[train-bn-expand]") {
  for (int64_t opset : {12, 13}) {
    CAPTURE(opset);
    BnCase c;
    c.opset = opset;
    c.dims = {2, 3, 2, 3, 2};
    c.attributes = "";
    // Opsets 7-13 allow 1 or 5 outputs; saved_mean/saved_var are declared but not read.
    c.nodeOutputs = {"y", "running_mean", "running_var", "saved_mean", "saved_var"};
    c.paramsAsInputs = true;
    auto model = parseCase(c);
    auto outcome = applyRulesAndCompare(*model, {kRule}, 1e-5, 1e-5);
    INFO(outcome.comparison.error);
    CHECK(outcome.comparison.ok);
    const auto unsqueezes = nodesOf(model->graph(), "Unsqueeze");
    REQUIRE(unsqueezes.size() == 2);
    CHECK(unsqueezes[0]->input(0)->name() == "scale");
    CHECK(unsqueezes[1]->input(0)->name() == "bias");
    for (const Node* unsqueeze : unsqueezes) {
      CHECK(axesOf(*unsqueeze) == std::vector<int64_t>{1, 2, 3});
      CHECK(unsqueeze->hasAttribute("axes") == (opset < 13));
    }
    CHECK(onlyEntry(outcome.report, "expanded")["dropped_outputs"] == nlohmann::json{"saved_mean", "saved_var"});
  }
}

TEST_CASE("train-bn-expand: only the outputs something reads are emitted", "[train-bn-expand]") {
  SECTION("Y read by a consumer, running statistics unread") {
    BnCase c;
    c.graphOutputs = {"r"};
    c.extraNodes = "  r = Relu (y)\n";
    auto model = parseCase(c);
    auto outcome = applyRulesAndCompare(*model, {kRule}, 1e-5, 1e-5);
    INFO(outcome.comparison.error);
    CHECK(outcome.comparison.ok);
    CHECK(opSequence(model->graph()) == "ReduceMean,Sub,Mul,ReduceMean,Add,Sqrt,Div,Mul,Add,Relu");
    const Node* relu = findNode(model->graph(), "Relu");
    CHECK(relu->input(0)->name() == "y");
    CHECK(relu->input(0)->producer()->opType() == "Add");
    const auto& entry = onlyEntry(outcome.report, "expanded");
    CHECK(entry["outputs"] == nlohmann::json{"y"});
    CHECK(entry["dropped_outputs"] == nlohmann::json{"running_mean", "running_var"});
  }
  SECTION("only running_mean read: no normalization, no variance") {
    BnCase c;
    c.graphOutputs = {"running_mean"};
    auto model = parseCase(c);
    auto outcome = applyRulesAndCompare(*model, {kRule}, 1e-5, 1e-5);
    INFO(outcome.comparison.error);
    CHECK(outcome.comparison.ok);
    CHECK(opSequence(model->graph()) == "ReduceMean,Squeeze,Mul,Mul,Add");
    CHECK(onlyEntry(outcome.report, "expanded")["outputs"] == nlohmann::json{"running_mean"});
  }
  SECTION("opset 9: only saved_var read") {
    BnCase c;
    c.opset = 9;
    c.attributes = "";
    c.nodeOutputs = {"y", "running_mean", "running_var", "saved_mean", "saved_var"};
    c.graphOutputs = {"saved_var"};
    auto model = parseCase(c);
    Report report = applyRules(*model, {kRule});
    CHECK(opSequence(model->graph()) == "ReduceMean,Sub,Mul,ReduceMean,Add,Sqrt,Reciprocal,Squeeze");
  }
  SECTION("nothing read: the node goes") {
    BnCase c;
    c.graphOutputs = {"r"};
    c.extraNodes = "  r = Relu (x)\n";
    auto model = parseCase(c);
    Report report = applyRules(*model, {kRule});
    CHECK(opSequence(model->graph()) == "Relu");
    CHECK(onlyEntry(report, "expanded")["emitted"].empty());
  }
}

TEST_CASE("train-bn-expand: a shared scale initializer is left unchanged", "[train-bn-expand]") {
  BnCase c;
  c.graphOutputs = {"y", "z"};
  c.extraNodes = "  z = Mul (scale, scale)\n";
  auto model = parseCase(c);
  const std::vector<double> before = valuesOf(model->graph().findLocal("scale"));
  auto outcome = applyRulesAndCompare(*model, {kRule}, 1e-5, 1e-5);
  INFO(outcome.comparison.error);
  CHECK(outcome.comparison.ok);
  const Value* scale = model->graph().findLocal("scale");
  REQUIRE(scale);
  CHECK(scale->initializer()->dims() == std::vector<int64_t>{3});
  CHECK(valuesOf(scale) == before);
  const Node* scaled = producerOf(model->graph(), "y")->input(0)->producer();
  CHECK(scaled->input(1) != scale);
  CHECK(scaled->input(1)->name() == "scale_channels");
}

TEST_CASE("train-bn-expand: an initializer that is also a graph input is read at run time", "[train-bn-expand]") {
  BnCase c;
  auto model = parseAs(modelText(c), DataType::Float, {}, [](onnx::ModelProto& proto) {
    // IR 8: declaring the initializer as an input makes it an overridable default.
    auto* input = proto.mutable_graph()->add_input();
    input->set_name("scale");
    auto* type = input->mutable_type()->mutable_tensor_type();
    type->set_elem_type(onnx::TensorProto::FLOAT);
    type->mutable_shape()->add_dim()->set_dim_value(3);
  });
  auto outcome = applyRulesAndCompare(*model, {kRule}, 1e-5, 1e-5);
  INFO(outcome.comparison.error);
  CHECK(outcome.comparison.ok);
  const auto unsqueezes = nodesOf(model->graph(), "Unsqueeze");
  REQUIRE(unsqueezes.size() == 1);
  CHECK(unsqueezes[0]->input(0)->name() == "scale");
}

TEST_CASE("train-bn-expand: rank and type from the Conv computing X when nothing declares them", "[train-bn-expand]") {
  auto model = parseModel(R"ONNX(
<ir_version: 8, opset_import: ["" : 15]>
g (float[2,2,5,5] input) => (float[2,3,5,5] r)
<float[3,2,1,1] w = {0.5, -1, 1.5, 0.25, -0.75, 1}, float[3] scale = {1, -2, 0.5}, float[3] bias = {0, 0.5, -1},
 float[3] mean = {0, 0, 0}, float[3] var = {1, 1, 1}>
{
  x = Conv (input, w)
  y, rm, rv = BatchNormalization <training_mode = 1> (x, scale, bias, mean, var)
  r = Relu (y)
}
)ONNX");
  auto outcome = applyRulesAndCompare(*model, {kRule}, 1e-5, 1e-5);
  INFO(outcome.comparison.error);
  CHECK(outcome.comparison.ok);
  CHECK(opSequence(model->graph()) == "Conv,ReduceMean,Sub,Mul,ReduceMean,Add,Sqrt,Div,Mul,Add,Relu");
  CHECK(nodesOf(model->graph(), "ReduceMean")[0]->attributeInts("axes") == std::vector<int64_t>{0, 2, 3});
}

TEST_CASE("train-bn-expand: opset 15 with scale/B and mean/var of other types than X", "[train-bn-expand]") {
  // ONNX Runtime runs these mixed-type forms of its training kernel, so it is the reference.
  SECTION("X float16, parameters and statistics float") {
    BnCase c;
    auto model =
        parseAs(modelText(c), DataType::Float16, {"scale", "bias", "mean", "var", "running_mean", "running_var"});
    auto outcome =
        applyRulesAndCompare(*model, {kRule}, toleranceFor(DataType::Float16), toleranceFor(DataType::Float16));
    INFO(outcome.comparison.error);
    CHECK(outcome.comparison.ok);
    const Graph& graph = model->graph();
    // The constant scale/B become float16 [C,1,1]; the batch statistics are cast to float for the running ones.
    const Node* scaled = producerOf(graph, "y")->input(0)->producer();
    CHECK(scaled->input(1)->initializer()->dataType() == DataType::Float16);
    const auto casts = nodesOf(graph, "Cast");
    REQUIRE(casts.size() == 2);
    for (const Node* cast : casts) CHECK(cast->attributeInt("to", 0) == static_cast<int64_t>(DataType::Float));
    CHECK(producerOf(graph, "running_mean")->input(0)->producer()->input(1)->initializer()->dataType() ==
          DataType::Float);
  }
  SECTION("X float, parameters and statistics float16, fed at run time") {
    BnCase c;
    c.paramsAsInputs = true;
    auto model = parseAs(modelText(c), DataType::Float16, {"x", "y"});
    auto outcome =
        applyRulesAndCompare(*model, {kRule}, toleranceFor(DataType::Float16), toleranceFor(DataType::Float16));
    INFO(outcome.comparison.error);
    CHECK(outcome.comparison.ok);
    const auto casts = nodesOf(model->graph(), "Cast");
    REQUIRE(casts.size() == 4);  // scale and B to float; batch mean and var to float16
    CHECK(casts[0]->input(0)->name() == "scale");
    CHECK(casts[0]->attributeInt("to", 0) == static_cast<int64_t>(DataType::Float));
  }
}

TEST_CASE("train-bn-expand: empty mean/var normalize with the batch statistics (numpy reference)",
          "[train-bn-expand][ort]") {
  // ONNX Runtime refuses to load the original (mean/var shapes do not unify with C), so the rewritten model is
  // compared with a numpy computation of the ONNX formula on a fixed input.
  BnCase c;
  c.emptyStatistics = true;
  c.attributes = "epsilon = 0.001";
  c.nodeOutputs = {"y"};
  c.graphOutputs = {"y"};
  auto model = parseCase(c);
  Report report = applyRules(*model, {kRule});
  CHECK(opSequence(model->graph()) == "ReduceMean,Sub,Mul,ReduceMean,Add,Sqrt,Div,Mul,Add");
  CHECK(onlyEntry(report, "expanded")["cause"] == "empty mean/var");
  CHECK(model->graph().findLocal("mean") == nullptr);  // no longer read by anything

  TempDir dir;
  saveModel(*model, dir.file("expanded.onnx"));
  std::filesystem::create_directories(dir.file("data/test_data_set_0"));
  {
    std::ofstream script(dir.file("reference.py"));
    script << "import sys, numpy as np, onnx.numpy_helper as nh\n"
              "out = sys.argv[1]\n"
              "x = np.random.default_rng(7).uniform(-2, 3, size=(2, 3, 4, 5)).astype(np.float32)\n"
              "scale = np.array(["
           << listText(scaleValues(3))
           << "], dtype=np.float64)\n"
              "bias = np.array(["
           << listText(biasValues(3))
           << "], dtype=np.float64)\n"
              "xd = x.astype(np.float64)\n"
              "mean = xd.mean(axis=(0, 2, 3), keepdims=True)\n"
              "var = ((xd - mean) ** 2).mean(axis=(0, 2, 3), keepdims=True)\n"
              "y = (xd - mean) / np.sqrt(var + np.float64(np.float32(0.001))) * scale.reshape(3, 1, 1) + "
              "bias.reshape(3, 1, 1)\n"
              "open(out + '/input_0.pb', 'wb').write(nh.from_array(x, 'x').SerializeToString())\n"
              "open(out + '/output_0.pb', 'wb').write(nh.from_array(y.astype(np.float32), 'y').SerializeToString())\n";
  }
  std::string out, err;
  REQUIRE(runCommand("/usr/bin/python3 " + dir.file("reference.py") + " " + dir.file("data/test_data_set_0"), &out,
                     &err) == 0);
  const int code =
      runCommand("node " + sourceDir() + "/scripts/ort/compare.js --against-testdata " + dir.file("expanded.onnx") +
                     " " + dir.file("data") + " --json --atol 1e-5 --rtol 1e-5",
                 &out, &err);
  INFO(out << err);
  CHECK(code == 0);
  CHECK(nlohmann::json::parse(out)["ok"] == true);
}

TEST_CASE("train-bn-expand: ONNX backend tests for training-mode BN pass through the CLI", "[train-bn-expand][ort]") {
  const std::string data = "/usr/share/libonnx-testdata/data/node";
  int tested = 0;
  for (const auto& entry : std::filesystem::directory_iterator(data)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("test_batchnorm_", 0) != 0 || name.size() < 14 ||
        name.compare(name.size() - 14, 14, "_training_mode") != 0)
      continue;
    CAPTURE(name);
    ++tested;
    TempDir dir;
    std::string out, err;
    REQUIRE(runCommand(bnfoldExecutable() + " fold " + entry.path().string() + "/model.onnx -o " +
                           dir.file("out.onnx") + " --report " + dir.file("report.json"),
                       &out, &err) == 0);
    std::ifstream reportFile(dir.file("report.json"));
    const auto report = nlohmann::json::parse(reportFile);
    CHECK(report["expanded"].size() == 1);
    CHECK(report["skipped"].empty());
    auto rewritten = loadModel(dir.file("out.onnx"));
    CHECK_FALSE(hasTrainingBatchNorm(*rewritten));
    const int code =
        runCommand("node " + sourceDir() + "/scripts/ort/compare.js --against-testdata " + dir.file("out.onnx") + " " +
                       entry.path().string() + " --json --atol 1e-5 --rtol 1e-5",
                   &out, &err);
    INFO(out << err);
    CHECK(code == 0);
    const auto comparison = nlohmann::json::parse(out);
    CHECK(comparison["ok"] == true);
    CHECK(comparison["outputs"].size() == 3);  // Y, running mean, running var
  }
  CHECK(tested >= 2);
}

TEST_CASE("train-bn-expand: BNs it refuses are reported with the reason", "[train-bn-expand]") {
  auto skippedReason = [](Model& model, const RuleOptions& options = {}) {
    Report report = applyRules(model, {kRule}, options);
    CHECK(report.section("expanded").empty());
    CHECK(countOps(model, "BatchNormalization") == 1);
    const auto& entry = onlyEntry(report, "skipped");
    return entry["reason"].get<std::string>();
  };
  SECTION("inference mode") {
    BnCase c;
    c.attributes = "";
    c.nodeOutputs = c.graphOutputs = {"y"};
    auto model = parseCase(c);
    CHECK(skippedReason(*model) == "not-training-mode");
  }
  SECTION("kept by the user") {
    BnCase c;
    auto model = parseCase(c);
    RuleOptions options;
    options.keepOps = {"BatchNormalization"};
    CHECK(skippedReason(*model, options) == "kept-by-user");
  }
  SECTION("spatial=0 in training mode") {
    BnCase c;
    c.opset = 7;
    c.attributes = "spatial = 0";
    auto model = parseCase(c);
    CHECK(skippedReason(*model) == "non-spatial-training");
  }
  SECTION("rank unknown") {
    BnCase c;
    c.graphOutputs = {"r"};
    c.extraNodes = "  r = Relu (y)\n";
    auto model = parseAs(modelText(c), DataType::Float, {}, [](onnx::ModelProto& proto) {
      proto.mutable_graph()->mutable_input(0)->mutable_type()->mutable_tensor_type()->clear_shape();
      proto.mutable_graph()->mutable_output(0)->mutable_type()->mutable_tensor_type()->clear_shape();
    });
    CHECK(skippedReason(*model) == "rank-unknown");
  }
  SECTION("X's element type unknown at opset 15, where scale/B/mean/var may have other types") {
    BnCase c;
    c.graphOutputs = {"r"};
    c.extraNodes = "  r = Relu (y)\n";
    const auto untyped = [](onnx::ModelProto& proto) {
      proto.mutable_graph()->mutable_input(0)->mutable_type()->mutable_tensor_type()->set_elem_type(0);
      proto.mutable_graph()->mutable_output(0)->mutable_type()->mutable_tensor_type()->set_elem_type(0);
    };
    auto model = parseAs(modelText(c), DataType::Float, {}, untyped);
    CHECK(skippedReason(*model) == "type-unknown");
    // Up to opset 14 every input has type T, so the parameters' type is X's.
    c.opset = 14;
    auto older = parseAs(modelText(c), DataType::Float, {}, untyped);
    Report report = applyRules(*older, {kRule});
    CHECK(report.section("expanded").size() == 1);
  }
  SECTION("empty mean/var while the running statistics are read") {
    BnCase c;
    c.emptyStatistics = true;
    auto model = parseCase(c);
    CHECK(skippedReason(*model) == "running-stats-undefined");
  }
  SECTION("bfloat16") {
    BnCase c;
    auto model = parseCase(c, DataType::BFloat16);
    CHECK(skippedReason(*model) == "unsupported-type");
  }
  SECTION("a constant scale that is not [C]") {
    BnCase c;
    auto model = parseAs(modelText(c), DataType::Float, {}, [](onnx::ModelProto& proto) {
      for (auto& initializer : *proto.mutable_graph()->mutable_initializer()) {
        if (initializer.name() != "scale") continue;
        initializer.clear_dims();
        initializer.add_dims(1);
        initializer.add_dims(3);
      }
    });
    CHECK(skippedReason(*model) == "param-shape-mismatch");
  }
}

TEST_CASE("train-bn-expand: is on by default and runs after bn-fold refuses a training BN", "[train-bn-expand]") {
  const Rule* rule = findRule(kRule);
  REQUIRE(rule);
  CHECK(rule->enabledByDefault());
  const auto defaults = parseRuleSelection("default");
  CHECK(std::find(defaults.begin(), defaults.end(), kRule) != defaults.end());
  BnCase c;
  auto model = parseCase(c);
  Report report = applyRules(*model, defaults);
  CHECK(report.section("expanded").size() == 1);
  CHECK(report.section("skipped").empty());
  CHECK(report.section("frozen").empty());
  CHECK_FALSE(hasTrainingBatchNorm(*model));
}

TEST_CASE("opset_emit: axes and shapes move from attribute to input at opsets 5, 13 and 18", "[train-bn-expand]") {
  struct Expectation {
    int64_t opset;
    bool reduceAxesInput, squeezeAxesInput, reshapeShapeInput;
  };
  for (const Expectation& e :
       {Expectation{4, false, false, false}, Expectation{5, false, false, true}, Expectation{12, false, false, true},
        Expectation{13, false, true, true}, Expectation{17, false, true, true}, Expectation{18, true, true, true}}) {
    CAPTURE(e.opset);
    auto model = parseModel("<ir_version: 8, opset_import: [\"\" : " + std::to_string(e.opset) +
                            "]>\ng (float[2,3,4] x) => (float[2,3,4] y)\n{\n  y = Identity (x)\n}\n");
    Report report;
    {
      Rewriter rewriter(*model, report);
      const Node* anchor = findNode(model->graph(), "Identity");
      const rules::EmitNames names{"emit", "v"};
      Value* x = model->graph().findLocal("x");
      rules::emitReduceMean(rewriter, anchor, x, {0, 2}, true, names, "reduce");
      rules::emitSqueeze(rewriter, anchor, x, {0}, names, "squeeze");
      rules::emitUnsqueeze(rewriter, anchor, x, {1, 3}, names, "unsqueeze");
      rules::emitReshape(rewriter, anchor, x, {6, -1}, names, "reshape");
    }
    const Graph& graph = model->graph();
    CHECK(opSequence(graph) == "ReduceMean,Squeeze,Unsqueeze,Reshape,Identity");
    const Node* reduce = findNode(graph, "ReduceMean");
    CHECK(reduce->name() == "emit/reduce");
    CHECK(reduce->output(0)->name() == "v_reduce");
    CHECK(reduce->hasAttribute("axes") != e.reduceAxesInput);
    CHECK(reduce->inputs().size() == (e.reduceAxesInput ? 2u : 1u));
    CHECK(axesOf(*reduce) == std::vector<int64_t>{0, 2});
    CHECK(reduce->attributeInt("keepdims", -1) == 1);
    for (const char* op : {"Squeeze", "Unsqueeze"}) {
      const Node* node = findNode(graph, op);
      CHECK(node->hasAttribute("axes") != e.squeezeAxesInput);
      CHECK(node->inputs().size() == (e.squeezeAxesInput ? 2u : 1u));
    }
    CHECK(axesOf(*findNode(graph, "Unsqueeze")) == std::vector<int64_t>{1, 3});
    const Node* reshape = findNode(graph, "Reshape");
    CHECK(reshape->hasAttribute("shape") != e.reshapeShapeInput);
    const std::vector<int64_t> shape =
        e.reshapeShapeInput ? reshape->input(1)->initializer()->toInt64s() : reshape->attributeInts("shape");
    CHECK(shape == std::vector<int64_t>{6, -1});
    graph.verify();
  }
}

TEST_CASE("train-bn-expand: a BN inside an If branch is expanded in that branch", "[train-bn-expand]") {
  // The condition is computed from constants (true), so ONNX Runtime runs the branch with the BN.
  auto model = parseModel(R"ONNX(
<ir_version: 8, opset_import: ["" : 15]>
g (float[2,3,4] x) => (float[2,3,4] out)
<float[3] scale = {1, -2, 0.5}, float[3] bias = {0, 0.5, -1}, float one = {1}, float zero = {0}>
{
  c = Greater (one, zero)
  out = If (c) <then_branch = then_g () => (float[2,3,4] t) <float[3] m = {0.5, 0, -0.5}, float[3] v = {1, 2, 3}> {
      t, rm, rv = BatchNormalization <training_mode = 1> (x, scale, bias, m, v)
    }, else_branch = else_g () => (float[2,3,4] e) {
      e = Relu (x)
    }>
}
)ONNX");
  auto outcome = applyRulesAndCompare(*model, {kRule}, 1e-5, 1e-5);
  INFO(outcome.comparison.error);
  CHECK(outcome.comparison.ok);
  const auto graphs = model->allGraphs();
  REQUIRE(graphs.size() == 3);
  const Graph& branch = *graphs[1];
  CHECK(branch.name() == "then_g");
  CHECK(opSequence(branch) == "ReduceMean,Sub,Mul,ReduceMean,Add,Sqrt,Div,Mul,Add");
  CHECK(graphOutputNames(branch) == std::vector<std::string>{"t"});
  // The [C, 1] scale and B and the epsilon are initializers of the branch, next to the nodes reading them.
  CHECK(branch.findLocal("scale_channels"));
  CHECK(model->graph().findLocal("scale_channels") == nullptr);
  CHECK_FALSE(hasTrainingBatchNorm(*model));
  CHECK(onlyEntry(outcome.report, "expanded")["graph"] == "then_g");
}
