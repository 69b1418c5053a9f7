#include "verifier.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <sstream>

#include "interpreter.h"

namespace bnfold::verify {
namespace {

// Stand-in batch: two samples where batch statistics or broadcasting over the batch are in play; one for a layer,
// whose samples are independent (it halves the largest cost of verifying a ResNet).
constexpr int64_t kStandInBatch = 2;
// The most elements the verifier makes up for one input (256 MiB of floats). A model's attributes can ask for any
// size; beyond this the rewrite cannot be evaluated, which counts as a failed verification.
constexpr int64_t kGeneratedElementLimit = int64_t{1} << 26;
// Kernel, dilation and stride sizes above this get no stand-in shape (their products would overflow).
constexpr int64_t kStandInSizeLimit = int64_t{1} << 20;
constexpr int64_t kStandInLayerBatch = 1;

const RegionNode* firstReader(const Region& region, const std::string& name, std::size_t* slot) {
  for (const RegionNode& node : region.nodes)
    for (std::size_t i = 0; i < node.inputs.size(); ++i)
      if (node.inputs[i] == name) {
        *slot = i;
        return &node;
      }
  return nullptr;
}

const ConstantOperand* constantInput(const Region& region, const RegionNode& node, std::size_t slot) {
  if (slot >= node.inputs.size()) return nullptr;
  auto it = region.constants.find(node.inputs[slot]);
  return it == region.constants.end() ? nullptr : &it->second;
}

// A small shape the reading op accepts: one sample for a layer (two elsewhere), channel and reduction dims from the
// weight, and each spatial dim of a convolution is its dilated kernel extent plus one stride, so that every
// kernel position is used and the output has positions at both borders (where padding is read).
std::optional<Dims> standInShape(const Region& region, const RuntimeInput& input) {
  std::size_t slot = 0;
  const RegionNode* reader = firstReader(region, input.name, &slot);
  if (!reader) return std::nullopt;
  const std::string& op = reader->opType;
  const std::optional<Dims>& known = input.knownShape;
  if ((op == "Conv" || op == "ConvTranspose") && slot == 0) {
    const ConstantOperand* w = constantInput(region, *reader, 1);
    if (!w || w->dims.size() < 3) return std::nullopt;
    const int64_t group = intAttribute(*reader, "group", 1);
    // Attributes are the model's, untrusted: a stand-in is made only from values in range (no overflow below).
    if (group < 1 || group > kStandInSizeLimit || w->dims[1] > kStandInSizeLimit) return std::nullopt;
    Dims dims = {kStandInLayerBatch, op == "Conv" ? w->dims[1] * group : w->dims[0]};
    if (op == "ConvTranspose" && !intsAttribute(*reader, "output_shape").empty()) return std::nullopt;  // fixes the input size
    const std::vector<int64_t> strides = intsAttribute(*reader, "strides"), dilations = intsAttribute(*reader, "dilations");
    const std::vector<int64_t> pads = intsAttribute(*reader, "pads");
    for (int64_t pad : pads)
      if (pad < 0 || pad > kStandInSizeLimit) return std::nullopt;
    const std::size_t spatial = w->dims.size() - 2;
    for (std::size_t i = 0; i < spatial; ++i) {
      const int64_t stride = std::max<int64_t>(i < strides.size() ? strides[i] : 1, 1);
      const int64_t dilation = i < dilations.size() ? dilations[i] : 1;
      if (stride > kStandInSizeLimit || dilation < 1 || dilation > kStandInSizeLimit ||
          w->dims[i + 2] > kStandInSizeLimit)
        return std::nullopt;
      const int64_t extent = (w->dims[i + 2] - 1) * dilation + 1;
      if (op == "Conv") {
        dims.push_back(extent + stride);
        continue;
      }
      // ConvTranspose: three input positions, more when the pads would crop the output to fewer than two.
      const int64_t cropped = pads.size() == 2 * spatial ? pads[i] + pads[i + spatial] : 0;
      dims.push_back(std::max<int64_t>(3, (2 + cropped - extent + stride - 1) / stride + 1));
    }
    return dims;
  }
  if (op == "BatchNormalization" && slot == 0) {
    const ConstantOperand* scale = constantInput(region, *reader, 1);
    int64_t channels = scale && scale->dims.size() == 1 ? scale->dims[0] : -1;
    if (channels < 0 && known && known->size() >= 2) channels = (*known)[1];
    if (channels < 0) return std::nullopt;
    const std::size_t rank = known ? std::max<std::size_t>(known->size(), 2) : 4;
    Dims dims = {kStandInBatch, channels};
    dims.resize(rank, 3);
    return dims;
  }
  if ((op == "Gemm" || op == "MatMul") && slot == 0) {
    const ConstantOperand* b = constantInput(region, *reader, 1);
    if (!b || b->dims.empty() || b->dims.size() > 2 + 8) return std::nullopt;
    if (op == "Gemm") {
      if (b->dims.size() != 2) return std::nullopt;
      const int64_t k = intAttribute(*reader, "transB", 0) ? b->dims[1] : b->dims[0];
      return intAttribute(*reader, "transA", 0) ? Dims{k, kStandInLayerBatch} : Dims{kStandInLayerBatch, k};
    }
    const int64_t k = b->dims.size() == 1 ? b->dims[0] : b->dims[b->dims.size() - 2];
    const std::size_t rank = known ? std::max<std::size_t>(known->size(), 2) : 2;
    Dims dims(rank, 1);
    dims[rank - 2] = kStandInBatch;
    dims[rank - 1] = k;
    return dims;
  }
  if ((op == "LayerNormalization" || op == "RMSNormalization") && slot == 0) {
    // The scale spans the normalized (trailing) dims; the others get small sizes.
    const ConstantOperand* scale = constantInput(region, *reader, 1);
    if (!scale) return std::nullopt;
    const std::size_t rank = known ? known->size() : scale->dims.size() + 1;
    if (rank < scale->dims.size() || rank == 0) return std::nullopt;
    Dims dims(rank, 3);
    dims[0] = kStandInBatch;
    std::copy(scale->dims.begin(), scale->dims.end(), dims.end() - static_cast<std::ptrdiff_t>(scale->dims.size()));
    return dims;
  }
  // Element-wise with a constant: the constant's non-1 dims are the channels; the rest gets small sizes.
  if (known && (op == "Add" || op == "Sub" || op == "Mul" || op == "Div")) {
    const ConstantOperand* other = constantInput(region, *reader, 1 - std::min<std::size_t>(slot, 1));
    Dims dims = *known;
    for (std::size_t i = 0; i < dims.size(); ++i) {
      const std::size_t fromEnd = dims.size() - i;
      const int64_t constDim =
          other && fromEnd <= other->dims.size() ? other->dims[other->dims.size() - fromEnd] : 1;
      dims[i] = constDim > 1 ? constDim : i == 0 ? kStandInBatch : 3;
    }
    return dims;
  }
  return std::nullopt;
}

// Shapes to try for one input, best first: the real shape when known and small; the stand-in; the known dims
// with the unknown ones filled in; the real shape even when large.
std::vector<Dims> shapeCandidates(const Region& region, const RuntimeInput& input) {
  std::vector<Dims> candidates;
  auto add = [&](const Dims& dims) {
    if (std::find(candidates.begin(), candidates.end(), dims) == candidates.end()) candidates.push_back(dims);
  };
  const std::optional<Dims>& known = input.knownShape;
  const bool fullyKnown = known && std::all_of(known->begin(), known->end(), [](int64_t d) { return d >= 0; });
  const int64_t knownCount = fullyKnown ? saturatingElementCount(*known) : INT64_MAX;
  if (fullyKnown && knownCount <= kRealShapeElementLimit) return {*known};
  if (auto standIn = standInShape(region, input)) add(*standIn);
  if (known) {
    Dims filled = *known;
    for (std::size_t i = 0; i < filled.size(); ++i)
      if (filled[i] < 0) filled[i] = i == 0 ? kStandInBatch : 3;
    add(filled);
  }
  if (fullyKnown && knownCount <= (int64_t{1} << 26)) add(*known);
  return candidates;
}

uint64_t nameHash(const std::string& name) {
  uint64_t hash = 1469598103934665603ULL;  // FNV-1a: stable across platforms, unlike std::hash
  for (unsigned char c : name) hash = (hash ^ c) * 1099511628211ULL;
  return hash;
}

// Whether the value feeds a slot that must be positive (a variance) in the original region.
bool feedsVariance(const Region& region, const std::string& name) {
  for (const RegionNode& node : region.nodes)
    if (node.opType == "BatchNormalization" && node.inputs.size() > 4 && node.inputs[4] == name) return true;
  return false;
}

template <typename T>
Operand<T> randomOperand(const RuntimeInput& input, const Dims& dims, DataType type, bool positive, uint64_t seed) {
  if (!isFloatingPoint(type))
    throw EvaluationError("run-time input '" + input.name + "' is of type " + dataTypeName(type) +
                          ", which the verifier cannot make up");
  std::mt19937_64 generator(seed ^ nameHash(input.name));
  std::uniform_real_distribution<double> distribution(positive ? 0.5 : -1.0, positive ? 1.5 : 1.0);
  Operand<T> operand;
  operand.type = type;
  operand.real.dims = dims;
  const int64_t count = saturatingElementCount(dims);
  if (count > kGeneratedElementLimit)
    throw EvaluationError("run-time input '" + input.name + "' would need " + std::to_string(count) +
                          " elements, more than the verifier makes up (" + std::to_string(kGeneratedElementLimit) + ")");
  operand.real.data.resize(static_cast<std::size_t>(count));
  for (T& v : operand.real.data) v = static_cast<T>(roundedTo(type, distribution(generator)));
  return operand;
}

struct Errors {
  double maxAbs = 0, maxRel = 0;
  bool mismatch = false;  // shapes, kinds or non-finite values differ
  std::string mismatchText;
};

template <typename T>
void compareOutput(const std::string& name, const Operand<T>& before, const Operand<T>& after, Errors& errors) {
  if (before.dims() != after.dims() || before.isInteger() != after.isInteger()) {
    errors.mismatch = true;
    errors.mismatchText = "'" + name + "' has another shape or type after the rewrite";
    return;
  }
  if (before.isInteger()) {
    if (before.integer.data != after.integer.data) {
      errors.mismatch = true;
      errors.mismatchText = "integer output '" + name + "' differs";
    }
    return;
  }
  const auto& a = before.real.data;
  const auto& b = after.real.data;
  // Values near zero are judged against the output's typical magnitude: that of the original or, when the original
  // is (nearly) all zeros, of the rewritten output.
  auto rmsOf = [](const std::vector<T>& values) {
    double sumSquares = 0;
    for (T v : values)
      if (std::isfinite(static_cast<double>(v))) sumSquares += static_cast<double>(v) * static_cast<double>(v);
    return values.empty() ? 0.0 : std::sqrt(sumSquares / static_cast<double>(values.size()));
  };
  const double rms = std::max(rmsOf(a), rmsOf(b));
  for (std::size_t i = 0; i < a.size(); ++i) {
    const double x = a[i], y = b[i];
    if (!std::isfinite(x) || !std::isfinite(y)) {
      if (x == y || (std::isnan(x) && std::isnan(y))) continue;
      errors.mismatch = true;
      errors.mismatchText = "'" + name + "' is not finite at element " + std::to_string(i) + " on one side only";
      errors.maxAbs = errors.maxRel = std::numeric_limits<double>::infinity();
      return;
    }
    const double difference = std::abs(x - y);
    if (difference == 0) continue;
    errors.maxAbs = std::max(errors.maxAbs, difference);
    errors.maxRel = std::max(errors.maxRel, difference / (std::abs(x) + rms));
  }
}

DataType regionComputeType(const RegionPair& regions) {
  for (const Region* region : {&regions.before, &regions.after}) {
    for (const auto& [name, constant] : region->constants)
      if (constant.type == DataType::Double) return DataType::Double;
    for (const RuntimeInput& input : region->inputs)
      if (input.type == DataType::Double) return DataType::Double;
  }
  return DataType::Float;
}

template <typename T>
void giveBack(std::map<std::string, Operand<T>>& values, BufferPool<T>& pool) {
  for (auto& [name, value] : values) pool.give(std::move(value.real.data));
  values.clear();
}

}  // namespace

template <typename T>
nlohmann::json Verifier::verifyAs(const RegionPair& regions, const VerifySettings& settings, BufferPool<T>& pool) {
  nlohmann::json result = {{"passed", false}, {"seed", settings.seed}};
  nlohmann::json outputs = regions.before.outputs;
  result["outputs"] = outputs;
  std::vector<std::vector<Dims>> candidates;
  std::size_t attempts = 1;
  for (const RuntimeInput& input : regions.before.inputs) {
    candidates.push_back(shapeCandidates(regions.before, input));
    if (candidates.back().empty())
      candidates.back().push_back(Dims(input.knownShape ? input.knownShape->size() : 4, 3));
    attempts = std::max(attempts, candidates.back().size());
  }
  std::string lastError;
  InterpreterOptions beforeOptions, afterOptions;
  beforeOptions.batchNormAsInference = settings.batchNormAsInference;
  // A rewrite exact only above a bound is compared where the bound holds: the value is drawn above it on both sides.
  nlohmann::json assumptions = nlohmann::json::array();
  for (const LowerBoundAssumption& assumption : regions.assumptions) {
    const uint64_t seed = settings.seed ^ nameHash(assumption.value);
    beforeOptions.sampled.push_back(
        {assumption.value, assumption.channelAxis, assumption.before, seed, assumption.width});
    afterOptions.sampled.push_back({assumption.value, assumption.channelAxis, assumption.after, seed, assumption.width});
    std::ostringstream width;
    width << assumption.width;
    assumptions.push_back({{"value", assumption.value}, {"statement", assumption.statement},
                           {"sampled", "at least the bound plus a uniform draw in [0, " + width.str() + ")"}});
  }
  if (!assumptions.empty()) result["assumptions"] = assumptions;
  for (std::size_t attempt = 0; attempt < attempts; ++attempt) {
    std::map<std::string, Operand<T>> inputs;
    nlohmann::json shapes = nlohmann::json::object();
    std::map<std::string, Operand<T>> before, after;
    try {
      for (std::size_t i = 0; i < regions.before.inputs.size(); ++i) {
        const RuntimeInput& input = regions.before.inputs[i];
        const Dims& dims = candidates[i][std::min(attempt, candidates[i].size() - 1)];
        const DataType type = input.type == DataType::Undefined ? dataTypeOf<T>() : input.type;
        inputs[input.name] = randomOperand<T>(input, dims, type, feedsVariance(regions.before, input.name), settings.seed);
        shapes[input.name] = dims;
      }
      before = evaluateRegion<T>(regions.before, inputs, beforeOptions, &pool);
    } catch (const std::exception& e) {
      lastError = std::string("the original cannot be evaluated: ") + e.what();
      continue;
    }
    try {
      after = evaluateRegion<T>(regions.after, inputs, afterOptions, &pool);
    } catch (const std::exception& e) {
      lastError = std::string("the rewritten nodes cannot be evaluated: ") + e.what();
      giveBack(before, pool);
      continue;
    }
    Errors errors;
    DataType outputType = dataTypeOf<T>();
    for (const std::string& name : regions.before.outputs) {
      auto b = before.find(name), a = after.find(name);
      if (b == before.end() || a == after.end()) {
        errors.mismatch = true;
        errors.mismatchText = "'" + name + "' is not computed by " + (b == before.end() ? "the original" : "the rewrite");
        break;
      }
      if (!b->second.isInteger()) outputType = b->second.type;
      compareOutput(name, b->second, a->second, errors);
      if (errors.mismatch) break;
    }
    const double tolerance = toleranceFor(outputType);
    result["input_shapes"] = shapes;
    result["data_type"] = dataTypeName(outputType);
    result["tolerance"] = tolerance;
    result["max_abs_error"] = std::isfinite(errors.maxAbs) ? nlohmann::json(errors.maxAbs) : nlohmann::json("inf");
    result["max_rel_error"] = std::isfinite(errors.maxRel) ? nlohmann::json(errors.maxRel) : nlohmann::json("inf");
    result["passed"] = !errors.mismatch && errors.maxRel <= tolerance;
    if (errors.mismatch) result["error"] = errors.mismatchText;
    giveBack(before, pool);
    giveBack(after, pool);
    return result;
  }
  result["error"] = lastError.empty() ? "no input shape to try" : lastError;
  return result;
}

double toleranceFor(DataType type) {
  switch (type) {
    case DataType::Double: return 1e-9;
    case DataType::Float16: return 1e-2;
    case DataType::BFloat16: return 5e-2;
    default: return 1e-4;
  }
}

nlohmann::json Verifier::verify(const RegionPair& regions, const VerifySettings& settings) {
  if (regionComputeType(regions) == DataType::Double) return verifyAs<double>(regions, settings, doubleBuffers_);
  return verifyAs<float>(regions, settings, floatBuffers_);
}

}  // namespace bnfold::verify
