// --target-opset N: the model is converted with libonnx's version converter before the rules run. The converted
// model must compute what the original did (ONNX Runtime), the report says from which opset it came, and what the
// converter cannot convert or would drop (functions, external data) is refused with one line, nothing written.

#include <catch2/catch.hpp>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <string>

#include <nlohmann/json.hpp>
#include <onnx/onnx_pb.h>

#include "bnfold/api/api.h"
#include "test_support.h"

using namespace bnfold;
using namespace bnfold::test;

namespace {

// A PyTorch-style LayerNorm chain at opset 14 (ReduceMean's axes an attribute, Pow for the square).
const char* kLayerNormChain = R"(<ir_version: 7, opset_import: ["" : 14]>
g (float[2,3,8] x) => (float[2,3,8] y)
<float[8] gamma = {0.5, 1, 1.5, 2, -1, 0.25, 3, 1}, float[8] beta = {0, 1, -1, 0.5, 0, 2, -2, 0.1},
 float two = {2}, float eps = {0.00001}>
{
  mean = ReduceMean <axes = [-1]> (x)
  d = Sub (x, mean)
  sq = Pow (d, two)
  var = ReduceMean <axes = [-1]> (sq)
  ve = Add (var, eps)
  sd = Sqrt (ve)
  n = Div (d, sd)
  scaled = Mul (n, gamma)
  y = Add (scaled, beta)
}
)";

std::string writeModel(const TempDir& dir, const std::string& name, const onnx::ModelProto& proto) {
  std::string bytes;
  REQUIRE(proto.SerializeToString(&bytes));
  const std::string path = dir.file(name);
  writeFile(path, bytes);
  return path;
}

int64_t fileOpset(const std::string& path) {
  onnx::ModelProto proto;
  REQUIRE(proto.ParseFromString(readFile(path)));
  for (const auto& import : proto.opset_import())
    if (import.domain().empty()) return import.version();
  return 0;
}

}  // namespace

TEST_CASE("target-opset: 17 converts an opset-14 LayerNorm chain: same outputs in ONNX Runtime, report says so",
          "[target-opset]") {
  TempDir dir;
  onnx::ModelProto proto = parseModelProto(kLayerNormChain);
  auto* meta = proto.add_metadata_props();
  meta->set_key("author");
  meta->set_value("test");
  const std::string input = writeModel(dir, "ln14.onnx", proto);
  const std::string output = dir.file("ln17.onnx"), report = dir.file("r.json");
  std::string out, err;
  REQUIRE(runCommand(cli("fold " + input + " -o " + output + " --report " + report + " --target-opset 17"), &out,
                     &err) == 0);
  CHECK(fileOpset(output) == 17);
  const auto json = nlohmann::json::parse(readFile(report));
  CHECK(json["opset"] == 17);
  CHECK(json["opset_converted"]["from"] == 14);
  CHECK(json["opset_converted"]["to"] == 17);
  onnx::ModelProto written;
  REQUIRE(written.ParseFromString(readFile(output)));
  REQUIRE(written.metadata_props_size() == 1);
  CHECK(written.metadata_props(0).value() == "test");
  const OrtComparison comparison = compareInOrt(input, output, 1e-5, 1e-4);
  INFO(comparison.error);
  CHECK(comparison.ok);

  // The library call says the same; a target equal to the model's opset converts nothing.
  Report libraryReport;
  auto model = loadModelAtOpset(input, 17, &libraryReport);
  CHECK(model->opsetVersion("") == 17);
  CHECK(libraryReport.json()["opset_converted"]["from"] == 14);
  Report unchangedReport;
  CHECK(loadModelAtOpset(input, 14, &unchangedReport)->opsetVersion("") == 14);
  CHECK_FALSE(unchangedReport.json().contains("opset_converted"));
  // check takes the flag too.
  CHECK(runCommand(cli("check " + input + " --target-opset 17"), &out, &err) == 0);
}

TEST_CASE("target-opset: refuses what it cannot convert or would drop, and writes nothing", "[target-opset]") {
  TempDir dir;
  onnx::ModelProto proto = parseModelProto(kLayerNormChain);
  const std::string plain = writeModel(dir, "plain.onnx", proto);

  onnx::ModelProto withFunction = proto;
  auto* function = withFunction.add_functions();
  function->set_name("helper");
  function->set_domain("local");
  const std::string functionModel = writeModel(dir, "function.onnx", withFunction);

  onnx::ModelProto external = proto;
  for (auto& tensor : *external.mutable_graph()->mutable_initializer()) {
    if (tensor.name() != "gamma") continue;
    std::string bytes(8 * sizeof(float), '\0');
    for (int i = 0; i < 8; ++i) {
      const float v = tensor.float_data(i);
      std::memcpy(bytes.data() + i * sizeof(float), &v, sizeof v);
    }
    writeFile(dir.file("gamma.bin"), bytes);
    tensor.clear_float_data();
    tensor.set_data_location(onnx::TensorProto::EXTERNAL);
    auto* location = tensor.add_external_data();
    location->set_key("location");
    location->set_value("gamma.bin");
  }
  const std::string externalModel = writeModel(dir, "external.onnx", external);

  struct Case {
    std::string input;
    std::string target;
    std::string says;
  };
  for (const Case& c : {Case{plain, "18", "up to 17"}, Case{plain, "13", "at opset 14 already"},
                        Case{functionModel, "17", "local function"}, Case{externalModel, "17", "external data"}}) {
    {
      INFO(c.input << " to " << c.target);
      const std::string output = dir.file("out.onnx");
      std::string out, err;
      CHECK(runCommand(cli("fold " + c.input + " -o " + output + " --target-opset " + c.target), &out, &err) == 2);
      CHECK(err.find(c.input) != std::string::npos);
      CHECK(err.find(c.says) != std::string::npos);
      CHECK(std::count(err.begin(), err.end(), '\n') == 1);
      CHECK_FALSE(std::filesystem::exists(output));
    }
  }
}
