// Folded weights are computed when they are read or saved (lib/rules/scaled_weight): read in any chunking they
// must give exactly the bytes of the eager computation (double products rounded once; a scaling of a scaling is
// one), and every save path — spliced into the main graph, inline in a subgraph, streamed into external data —
// must write those bytes.
#include <catch2/catch.hpp>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "bnfold/io/model_io.h"
#include "rules/scaled_weight.h"
#include "test_bn_fold_support.h"
#include "test_support.h"

using namespace bnfold;
using namespace bnfold::test;
using namespace bnfold::test::bnfold_cases;

namespace {

std::string readAll(const DeferredBytes& bytes) {
  std::string out(static_cast<std::size_t>(bytes.size()), '\0');
  bytes.read(0, bytes.size(), out.data());
  return out;
}

/// The bytes of `values` rounded to `type`, or for double (where composed factors multiply in another order than
/// one after the other) values within a few ulps of them.
void checkRoundedOnce(const DeferredBytes& bytes, DataType type, const kernels::Dims& dims,
                      const std::vector<double>& values) {
  const std::string read = readAll(bytes);
  if (type != DataType::Double) {
    CHECK(read == std::string(Tensor::fromDoubles("e", type, dims, values).bytes()));
    return;
  }
  REQUIRE(read.size() == values.size() * sizeof(double));
  for (std::size_t i = 0; i < values.size(); ++i) {
    double value = 0.0;
    std::memcpy(&value, read.data() + i * sizeof(double), sizeof(double));
    CHECK(value == Approx(values[i]).epsilon(1e-15));
  }
}

/// A weight of each layout the scalings index: grouped Conv (3x3 and 1x1), grouped ConvTranspose, Gemm (transB 0
/// and 1), MatMul.
std::vector<std::pair<kernels::WeightLayout, kernels::Dims>> weightLayouts() {
  using Kind = kernels::WeightKind;
  return {{{Kind::Conv, 2, false}, {6, 2, 3, 3}},
          {{Kind::Conv, 1, false}, {6, 4, 1, 1}},
          {{Kind::ConvTranspose, 3, false}, {6, 2, 2, 1}},
          {{Kind::Gemm, 1, false}, {5, 7}},
          {{Kind::Gemm, 1, true}, {7, 5}},
          {{Kind::MatMul, 1, false}, {4, 9}}};
}

}  // namespace

TEST_CASE("scaled weights read in any chunking equal the eager double computation", "[scaled-weight]") {
  for (DataType type : {DataType::Float, DataType::Double, DataType::Float16, DataType::BFloat16}) {
    for (const auto& [layout, dims] : weightLayouts()) {
      for (bool output : {true, false}) {
        INFO(dataTypeName(type) << " kind " << static_cast<int>(layout.kind) << (output ? " output" : " input"));
        const auto channels = output ? *kernels::outputChannelCount(layout, dims)
                                     : *kernels::inputChannelCount(layout, dims);
        const std::vector<double> scale = sampleValues(static_cast<std::size_t>(channels), 3.0, -2.0, 2.0);
        const Tensor original = Tensor::fromDoubles("w", type, dims, sampleValues(product(dims, 0), 4.0, -3.0, 3.0));

        // Eager reference: every element to double, scaled, rounded once.
        std::vector<double> expectedValues = original.toDoubles();
        if (output) kernels::scaleOutputChannels(layout, expectedValues, dims, scale);
        else kernels::scaleInputChannels(layout, expectedValues, dims, scale);
        const std::string expected(Tensor::fromDoubles("e", type, dims, expectedValues).bytes());

        const auto indexing = output ? *kernels::outputChannelIndexing(layout, dims)
                                     : *kernels::inputChannelIndexing(layout, dims);
        auto scaled = rules::scaledChannelBytes(original.byteSource(), type, indexing, scale);
        REQUIRE(readAll(*scaled) == expected);
        const auto elementBytes = static_cast<int64_t>(elementSize(type));
        for (int64_t chunkElements : {1, 2, 5, 7, 64}) {
          std::string chunked(expected.size(), '\0');
          for (int64_t offset = 0; offset < scaled->size(); offset += chunkElements * elementBytes) {
            const int64_t length = std::min<int64_t>(chunkElements * elementBytes, scaled->size() - offset);
            scaled->read(offset, length, chunked.data() + offset);
          }
          REQUIRE(chunked == expected);
        }
        // A scaling of a scaling (two BNs in a row, a fold then equalize) is one: both factors in double on the
        // original values, rounded once.
        auto twice = rules::scaledChannelBytes(scaled, type, indexing, scale);
        std::vector<double> twiceValues = expectedValues;
        if (output) kernels::scaleOutputChannels(layout, twiceValues, dims, scale);
        else kernels::scaleInputChannels(layout, twiceValues, dims, scale);
        checkRoundedOnce(*twice, type, dims, twiceValues);
        // And on the other side, then on both sides again: still one rounding of the product.
        const auto otherIndexing =
            output ? *kernels::inputChannelIndexing(layout, dims) : *kernels::outputChannelIndexing(layout, dims);
        const auto otherChannels =
            output ? *kernels::inputChannelCount(layout, dims) : *kernels::outputChannelCount(layout, dims);
        const std::vector<double> other = sampleValues(static_cast<std::size_t>(otherChannels), 5.0, -2.0, 2.0);
        auto sides = rules::scaledChannelBytes(twice, type, otherIndexing, other);
        auto again = rules::scaledChannelBytes(sides, type, indexing, scale);
        std::vector<double> sidesValues = twiceValues;
        if (output)
          kernels::scaleInputChannels(layout, sidesValues, dims, other);
        else
          kernels::scaleOutputChannels(layout, sidesValues, dims, other);
        checkRoundedOnce(*sides, type, dims, sidesValues);
        if (output)
          kernels::scaleOutputChannels(layout, sidesValues, dims, scale);
        else
          kernels::scaleInputChannels(layout, sidesValues, dims, scale);
        checkRoundedOnce(*again, type, dims, sidesValues);
        // Reads must fall on element boundaries.
        if (elementBytes > 1) CHECK_THROWS_AS(scaled->read(1, elementBytes, std::string(8, '\0').data()),
                                              std::invalid_argument);
      }
    }
  }
}

TEST_CASE("a weight reader gives toDoubles' values in any piece, held or computed on demand", "[scaled-weight]") {
  const kernels::Dims dims{6, 2, 3, 3};
  const std::vector<double> scale = sampleValues(6, 3.0, -2.0, 2.0);
  const auto indexing = *kernels::outputChannelIndexing({kernels::WeightKind::Conv, 1, false}, dims);
  for (DataType type : {DataType::Float, DataType::Double, DataType::Float16, DataType::BFloat16}) {
    INFO(dataTypeName(type));
    const Tensor held = Tensor::fromDoubles("w", type, dims, sampleValues(product(dims, 0), 4.0, -3.0, 3.0));
    // A folded weight: bytes computed when read, which the reader must ask for a piece at a time.
    const Tensor computed =
        Tensor::deferred("f", type, dims, rules::scaledChannelBytes(held.byteSource(), type, indexing, scale));
    for (const Tensor* weight : {&held, &computed}) {
      const std::vector<double> expected = weight->toDoubles();
      const kernels::WeightReader read = rules::weightReader(*weight);
      for (int64_t piece : {1, 5, 108}) {
        std::vector<double> values(expected.size());
        for (int64_t first = 0; first < static_cast<int64_t>(values.size()); first += piece)
          read(first, std::min<int64_t>(piece, static_cast<int64_t>(values.size()) - first), values.data() + first);
        CHECK(values == expected);
      }
    }
  }
  CHECK_THROWS_AS(rules::weightReader(Tensor::fromInt64s("i", {2}, {1, 2})), std::invalid_argument);
}

TEST_CASE("a weight reader of a weight scaled on either side or both gives toDoubles' values in any layout",
          "[scaled-weight]") {
  // Float and double are read straight from the bytes below the scaling (readDoubles), the others through read():
  // both must give what the scaled bytes hold.
  for (DataType type : {DataType::Float, DataType::Double, DataType::Float16, DataType::BFloat16}) {
    for (const auto& [layout, dims] : weightLayouts()) {
      INFO(dataTypeName(type) << " kind " << static_cast<int>(layout.kind) << " dims " << dims.size());
      const auto outIndexing = *kernels::outputChannelIndexing(layout, dims);
      const auto inIndexing = *kernels::inputChannelIndexing(layout, dims);
      const std::vector<double> outScale =
          sampleValues(static_cast<std::size_t>(*kernels::outputChannelCount(layout, dims)), 6.0, -2.0, 2.0);
      const std::vector<double> inScale =
          sampleValues(static_cast<std::size_t>(*kernels::inputChannelCount(layout, dims)), 7.0, -2.0, 2.0);
      const Tensor held = Tensor::fromDoubles("w", type, dims, sampleValues(product(dims, 0), 8.0, -3.0, 3.0));
      const std::vector<std::shared_ptr<const DeferredBytes>> scaled = {
          rules::scaledChannelBytes(held.byteSource(), type, outIndexing, outScale),
          rules::scaledChannelBytes(held.byteSource(), type, inIndexing, inScale),
          rules::scaledBothSidesBytes(held.byteSource(), type, outIndexing, outScale, inIndexing, inScale)};
      for (const auto& bytes : scaled) {
        const Tensor weight = Tensor::deferred("s", type, dims, bytes);
        const std::vector<double> expected = weight.toDoubles();
        const kernels::WeightReader read = rules::weightReader(weight);
        for (int64_t piece : {1, 5, 7, 1000}) {
          std::vector<double> values(expected.size());
          for (int64_t first = 0; first < static_cast<int64_t>(values.size()); first += piece)
            read(first, std::min<int64_t>(piece, static_cast<int64_t>(values.size()) - first), values.data() + first);
          CHECK(values == expected);
        }
      }
    }
  }
}

TEST_CASE("a folded weight of an external-data model is streamed into the output's data file", "[scaled-weight][external]") {
  TempDir dir;
  std::filesystem::create_directories(dir.file("in"));
  const std::vector<int64_t> weightDims{16, 8, 3, 3};
  const BnParams bn = makeBnParams(16, 2.0);
  const std::vector<double> weights = asFloats(sampleValues(product(weightDims, 0), 5.0));
  onnx::ModelProto proto = parseModelProto(R"ONNX(
<ir_version: 8, opset_import: ["" : 15]>
g (float[1,8,6,6] x) => (float[1,16,6,6] y)
<)ONNX" + tensorText("float", "w", weightDims, weights) + ", " + bnInitializers(bn) + R"ONNX(>
{
  c = Conv <pads = [1,1,1,1]> (x, w)
  y = BatchNormalization <epsilon = 0.001> (c, s, b, m, v)
}
)ONNX");
  // Move w into a data file beside the model.
  auto* w = proto.mutable_graph()->mutable_initializer(0);
  const std::string data(Tensor::fromDoubles("w", DataType::Float, weightDims, weights).bytes());
  std::ofstream(dir.file("in/w.bin"), std::ios::binary) << data;
  w->clear_float_data();
  w->set_data_location(onnx::TensorProto::EXTERNAL);
  for (auto [key, value] : {std::pair<std::string, std::string>{"location", "w.bin"}, {"offset", "0"},
                            {"length", std::to_string(data.size())}}) {
    auto* entry = w->add_external_data();
    entry->set_key(key);
    entry->set_value(value);
  }
  {
    std::ofstream out(dir.file("in/model.onnx"), std::ios::binary);
    proto.SerializeToOstream(&out);
  }

  auto model = loadModel(dir.file("in/model.onnx"));
  applyRules(*model, {"bn-fold"});
  REQUIRE(countOps(*model, "BatchNormalization") == 0);
  const Tensor* folded = findNode(model->graph(), "Conv")->input(1)->initializer();
  REQUIRE(folded->deferredRawData() != nullptr);  // computed on save, not held
  saveModel(*model, dir.file("folded.onnx"));
  CHECK(folded->deferredRawData() != nullptr);

  auto reloaded = loadModel(dir.file("folded.onnx"));
  const Tensor* saved = findNode(reloaded->graph(), "Conv")->input(1)->initializer();
  REQUIRE(saved->isExternal());
  CHECK(saved->externalData().location == "folded.onnx.data");
  std::vector<double> expected = weights;
  kernels::scaleOutputChannels({kernels::WeightKind::Conv, 1, false}, expected, weightDims, bnMultiplier(bn));
  CHECK(std::string(saved->bytes()) ==
        std::string(Tensor::fromDoubles("e", DataType::Float, weightDims, expected).bytes()));

  const OrtComparison comparison = compareInOrt(dir.file("in/model.onnx"), dir.file("folded.onnx"), 1e-5, 1e-4);
  INFO(comparison.error << " " << comparison.details.dump());
  CHECK(comparison.ok);
}
