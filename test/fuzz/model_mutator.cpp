#include "model_mutator.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "fuzz_support.h"

namespace bnfold::fuzz {
namespace {

using onnx::AttributeProto;
using onnx::GraphProto;
using onnx::ModelProto;
using onnx::NodeProto;
using onnx::TensorProto;
using onnx::ValueInfoProto;

using MutateBytes = std::size_t (*)(uint8_t*, std::size_t, std::size_t);

constexpr int64_t kInt64Max = std::numeric_limits<int64_t>::max();
constexpr int64_t kInt64Min = std::numeric_limits<int64_t>::min();

// Sizes and counts where arithmetic goes wrong: zero, negative, 32-bit limits, and products that overflow or wrap
// to a real element count (576460752303423552 * 32 wraps to 2048).
const std::vector<int64_t> kInterestingInts = {
    0, 1, 2, 3, 4, -1, -2, 7, 8, 16, 64, int64_t{1} << 31, (int64_t{1} << 31) - 1, int64_t{1} << 32,
    int64_t{1} << 62, kInt64Max, kInt64Min, 576460752303423552};

const std::vector<double> kInterestingFloats = {
    0.0, -0.0, 1.0, -1.0, 2.0, 1e-5, 1e-3, 0.9, 0.1, 1e38, -1e38, 1e-45, 3.4e38,
    std::numeric_limits<double>::quiet_NaN(), std::numeric_limits<double>::infinity(),
    -std::numeric_limits<double>::infinity()};

const std::vector<int> kDataTypes = {
    TensorProto::FLOAT, TensorProto::DOUBLE, TensorProto::FLOAT16, TensorProto::BFLOAT16, TensorProto::INT64,
    TensorProto::INT32, TensorProto::INT8, TensorProto::UINT8, TensorProto::BOOL, TensorProto::STRING,
    TensorProto::UINT64, TensorProto::COMPLEX64, TensorProto::UNDEFINED, 99};

// Op types bnfold's rules root at, look through, or evaluate, plus a few they must leave alone.
const std::vector<const char*> kOpTypes = {"Conv",
                                           "ConvTranspose",
                                           "Gemm",
                                           "MatMul",
                                           "BatchNormalization",
                                           "Add",
                                           "Mul",
                                           "Sub",
                                           "Div",
                                           "Identity",
                                           "Transpose",
                                           "Reshape",
                                           "Flatten",
                                           "Squeeze",
                                           "Unsqueeze",
                                           "Concat",
                                           "Relu",
                                           "Constant",
                                           "Cast",
                                           "ConstantOfShape",
                                           "Slice",
                                           "Gather",
                                           "Expand",
                                           "Pow",
                                           "Max",
                                           "Min",
                                           "Neg",
                                           "Sqrt",
                                           "Reciprocal",
                                           "DequantizeLinear",
                                           "If",
                                           "Sigmoid",
                                           "GlobalAveragePool",
                                           "ReduceMean",
                                           "MaxPool",
                                           "AveragePool",
                                           "GlobalMaxPool",
                                           "LeakyRelu"};

// The layout ops the rules see through between a layer and its BN.
const std::vector<const char*> kLayoutOps = {"Identity", "Transpose", "Reshape", "Flatten", "Squeeze", "Unsqueeze"};

enum class AttrKind { Float, Int, Ints, String };
struct AttrSpec {
  const char* name;
  AttrKind kind;
};
const std::vector<AttrSpec> kAttributes = {{"epsilon", AttrKind::Float},
                                           {"momentum", AttrKind::Float},
                                           {"alpha", AttrKind::Float},
                                           {"beta", AttrKind::Float},
                                           {"group", AttrKind::Int},
                                           {"axis", AttrKind::Int},
                                           {"training_mode", AttrKind::Int},
                                           {"transA", AttrKind::Int},
                                           {"transB", AttrKind::Int},
                                           {"is_test", AttrKind::Int},
                                           {"spatial", AttrKind::Int},
                                           {"broadcast", AttrKind::Int},
                                           {"keepdims", AttrKind::Int},
                                           {"to", AttrKind::Int},
                                           {"allowzero", AttrKind::Int},
                                           {"pads", AttrKind::Ints},
                                           {"strides", AttrKind::Ints},
                                           {"dilations", AttrKind::Ints},
                                           {"kernel_shape", AttrKind::Ints},
                                           {"perm", AttrKind::Ints},
                                           {"axes", AttrKind::Ints},
                                           {"output_padding", AttrKind::Ints},
                                           {"output_shape", AttrKind::Ints},
                                           {"shape", AttrKind::Ints},
                                           {"consumed_inputs", AttrKind::Ints},
                                           {"auto_pad", AttrKind::String},
                                           {"ceil_mode", AttrKind::Int},
                                           {"count_include_pad", AttrKind::Int}};

class Mutator {
 public:
  Mutator(ModelProto& model, uint32_t seed, MutateBytes mutateBytes)
      : model_(model), rng_(seed), mutateBytes_(mutateBytes) {
    collectGraphs(*model_.mutable_graph());
  }

  void run() {
    const std::vector<std::function<bool()>> mutations = {
        [this] { return mutateDims(); },          [this] { return mutateDataType(); },
        [this] { return mutateAttribute(); },     [this] { return mutateAttribute(); },
        [this] { return shuffleNodes(); },        [this] { return collideNames(); },
        [this] { return mutateBatchNormParams(); }, [this] { return mutateBatchNormParams(); },
        [this] { return mutateTensorBytes(); },   [this] { return mutateExternalData(); },
        [this] { return mutateOpType(); },        [this] { return mutateNodeArity(); },
        [this] { return mutateOpsets(); },        [this] { return mutateGraphInterface(); },
        [this] { return mutateStructure(); },     [this] { return mutateStructure(); },
        [this] { return insertBatchNorm(); },     [this] { return insertBatchNorm(); },
        [this] { return insertChannelConstantOp(); }};
    const int count = 1 + static_cast<int>(below(3));
    for (int done = 0, attempts = 0; done < count && attempts < 20; ++attempts) {
      done += mutations[below(mutations.size())]() ? 1 : 0;
      // A mutation may have erased a node holding a subgraph.
      graphs_.clear();
      collectGraphs(*model_.mutable_graph());
    }
  }

 private:
  // ---- random choices ----
  std::size_t below(std::size_t n) { return n == 0 ? 0 : std::uniform_int_distribution<std::size_t>(0, n - 1)(rng_); }
  bool chance(int percent) { return static_cast<int>(below(100)) < percent; }
  int64_t smallInt() { return static_cast<int64_t>(below(7)) - 2; }
  int64_t interestingInt() { return chance(50) ? smallInt() : kInterestingInts[below(kInterestingInts.size())]; }
  double interestingFloat() { return kInterestingFloats[below(kInterestingFloats.size())]; }
  template <class Container>
  auto& pick(Container& items) { return items[static_cast<int>(below(static_cast<std::size_t>(items.size())))]; }

  // ---- what the model holds ----
  void collectGraphs(GraphProto& graph) {
    graphs_.push_back(&graph);
    for (NodeProto& node : *graph.mutable_node())
      for (AttributeProto& attr : *node.mutable_attribute()) {
        if (attr.has_g()) collectGraphs(*attr.mutable_g());
        for (GraphProto& sub : *attr.mutable_graphs()) collectGraphs(sub);
      }
  }
  GraphProto& anyGraph() { return chance(70) ? *graphs_.front() : *pick(graphs_); }
  NodeProto* anyNode(GraphProto& graph) {
    return graph.node_size() == 0 ? nullptr : &pick(*graph.mutable_node());
  }
  TensorProto* anyInitializer(GraphProto& graph) {
    return graph.initializer_size() == 0 ? nullptr : &pick(*graph.mutable_initializer());
  }
  TensorProto* initializerNamed(const std::string& name) {
    for (GraphProto* graph : graphs_)
      for (TensorProto& tensor : *graph->mutable_initializer())
        if (tensor.name() == name) return &tensor;
    return nullptr;
  }
  // Every name a node could read in this graph: initializers, inputs and node outputs.
  std::vector<std::string> valueNames(const GraphProto& graph) const {
    std::vector<std::string> names;
    for (const auto& tensor : graph.initializer()) names.push_back(tensor.name());
    for (const auto& input : graph.input()) names.push_back(input.name());
    for (const auto& node : graph.node())
      for (const auto& output : node.output()) names.push_back(output);
    return names;
  }
  std::string freshName(const std::string& hint) { return hint + "_fz" + std::to_string(nextName_++); }

  // ---- tensor values (FLOAT, DOUBLE, FLOAT16, BFLOAT16 in raw_data or typed fields) ----
  static int elementBytes(int dataType) {
    switch (dataType) {
      case TensorProto::DOUBLE: case TensorProto::INT64: case TensorProto::UINT64: case TensorProto::COMPLEX64:
        return 8;
      case TensorProto::FLOAT: case TensorProto::INT32: case TensorProto::UINT32: return 4;
      case TensorProto::FLOAT16: case TensorProto::BFLOAT16: case TensorProto::INT16: case TensorProto::UINT16:
        return 2;
      case TensorProto::INT8: case TensorProto::UINT8: case TensorProto::BOOL: return 1;
      default: return 0;
    }
  }
  static uint16_t toHalfBits(float value) {
    uint32_t bits;
    std::memcpy(&bits, &value, 4);
    const uint32_t sign = (bits >> 16) & 0x8000u;
    if (std::isnan(value)) return static_cast<uint16_t>(sign | 0x7e00u);
    const int exponent = static_cast<int>((bits >> 23) & 0xff) - 127 + 15;
    if (exponent >= 31) return static_cast<uint16_t>(sign | 0x7c00u);  // overflow: infinity
    if (exponent <= 0) return static_cast<uint16_t>(sign);              // underflow: signed zero
    return static_cast<uint16_t>(sign | (static_cast<uint32_t>(exponent) << 10) | ((bits >> 13) & 0x3ffu));
  }
  static std::size_t floatElementCount(const TensorProto& tensor) {
    const int bytes = elementBytes(tensor.data_type());
    if (tensor.has_raw_data() && bytes > 0) return tensor.raw_data().size() / static_cast<std::size_t>(bytes);
    switch (tensor.data_type()) {
      case TensorProto::FLOAT: return static_cast<std::size_t>(tensor.float_data_size());
      case TensorProto::DOUBLE: return static_cast<std::size_t>(tensor.double_data_size());
      case TensorProto::FLOAT16: case TensorProto::BFLOAT16: return static_cast<std::size_t>(tensor.int32_data_size());
      default: return 0;
    }
  }
  static void setFloatElement(TensorProto& tensor, std::size_t index, double value) {
    const int type = tensor.data_type();
    const auto at = static_cast<int>(index);
    uint16_t half = 0;
    if (type == TensorProto::FLOAT16) half = toHalfBits(static_cast<float>(value));
    if (type == TensorProto::BFLOAT16) {
      const float narrow = static_cast<float>(value);
      uint32_t bits;
      std::memcpy(&bits, &narrow, 4);
      half = static_cast<uint16_t>(bits >> 16);
    }
    if (tensor.has_raw_data()) {
      std::string& raw = *tensor.mutable_raw_data();
      if (type == TensorProto::FLOAT) {
        const float narrow = static_cast<float>(value);
        std::memcpy(&raw[index * 4], &narrow, 4);
      } else if (type == TensorProto::DOUBLE) {
        std::memcpy(&raw[index * 8], &value, 8);
      } else if (type == TensorProto::FLOAT16 || type == TensorProto::BFLOAT16) {
        std::memcpy(&raw[index * 2], &half, 2);
      }
      return;
    }
    if (type == TensorProto::FLOAT) tensor.set_float_data(at, static_cast<float>(value));
    else if (type == TensorProto::DOUBLE) tensor.set_double_data(at, value);
    else if (type == TensorProto::FLOAT16 || type == TensorProto::BFLOAT16) tensor.set_int32_data(at, half);
  }
  // Typed fields -> raw_data, so byte-level mutations have bytes to work on.
  static void moveToRawData(TensorProto& tensor) {
    if (tensor.has_raw_data()) return;
    std::string raw;
    auto append = [&raw](const void* data, std::size_t size) { raw.append(static_cast<const char*>(data), size); };
    switch (tensor.data_type()) {
      case TensorProto::FLOAT: for (float v : tensor.float_data()) append(&v, 4); break;
      case TensorProto::DOUBLE: for (double v : tensor.double_data()) append(&v, 8); break;
      case TensorProto::INT64: for (int64_t v : tensor.int64_data()) append(&v, 8); break;
      case TensorProto::INT32: for (int32_t v : tensor.int32_data()) append(&v, 4); break;
      default: return;
    }
    tensor.clear_float_data();
    tensor.clear_double_data();
    tensor.clear_int64_data();
    tensor.clear_int32_data();
    tensor.set_raw_data(raw);
  }
  static std::vector<int64_t> dimsOf(const TensorProto& tensor) {
    return {tensor.dims().begin(), tensor.dims().end()};
  }
  static void setDims(TensorProto& tensor, const std::vector<int64_t>& dims) {
    tensor.clear_dims();
    for (int64_t dim : dims) tensor.add_dims(dim);
  }
  TensorProto floatTensor(const std::string& name, const std::vector<int64_t>& dims, double low, double high) {
    TensorProto tensor;
    tensor.set_name(name);
    tensor.set_data_type(TensorProto::FLOAT);
    setDims(tensor, dims);
    int64_t count = 1;
    for (int64_t dim : dims) count *= dim;
    std::uniform_real_distribution<double> value(low, high);
    std::string raw;
    for (int64_t i = 0; i < count; ++i) {
      const float v = static_cast<float>(value(rng_));
      raw.append(reinterpret_cast<const char*>(&v), 4);
    }
    tensor.set_raw_data(raw);
    return tensor;
  }

  // ---- the mutations ----
  bool mutateDims() {
    GraphProto& graph = anyGraph();
    if (chance(50)) {
      TensorProto* tensor = anyInitializer(graph);
      if (!tensor) return false;
      std::vector<int64_t> dims = dimsOf(*tensor);
      switch (below(6)) {
        case 0:  // any value in one dim: the loader must reject what does not match the bytes
          if (dims.empty()) dims.push_back(interestingInt());
          else pick(dims) = interestingInt();
          break;
        case 1:  // the same element count in another layout: loads, and the rules see unexpected ranks
          std::shuffle(dims.begin(), dims.end(), rng_);
          break;
        case 2:
          dims.insert(dims.begin() + static_cast<long>(below(dims.size() + 1)), 1);
          break;
        case 3:
          if (dims.size() >= 2) {
            const std::size_t at = below(dims.size() - 1);
            // Wrapping multiplication: the harness must not overflow signed integers itself.
            dims[at] = static_cast<int64_t>(static_cast<uint64_t>(dims[at]) * static_cast<uint64_t>(dims[at + 1]));
            dims.erase(dims.begin() + static_cast<long>(at) + 1);
          } else {
            dims.clear();
          }
          break;
        case 4:
          if (!dims.empty()) dims.pop_back();
          break;
        default: {
          // No elements, so no data, and another dim that claims billions of channels: loads, and nothing may
          // size a buffer by dims that no bytes back.
          static const std::vector<int64_t> claimed = {int64_t{1} << 31, int64_t{1} << 40, (int64_t{1} << 56) + 3};
          while (dims.size() < 2) dims.push_back(1);
          const std::size_t empty = below(dims.size());
          dims[empty] = 0;
          dims[(empty + 1 + below(dims.size() - 1)) % dims.size()] = pick(claimed);
          tensor->clear_raw_data();
          tensor->clear_float_data();
          tensor->clear_double_data();
          tensor->clear_int32_data();
          tensor->clear_int64_data();
          tensor->clear_external_data();
          tensor->set_data_location(TensorProto::DEFAULT);
        }
      }
      setDims(*tensor, dims);
      return true;
    }
    // Declared shapes of inputs, outputs and value_info: the rules read ranks and channel counts from them.
    std::vector<ValueInfoProto*> infos;
    for (auto* list : {graph.mutable_input(), graph.mutable_output(), graph.mutable_value_info()})
      for (ValueInfoProto& info : *list) infos.push_back(&info);
    if (infos.empty()) return false;
    auto* shape = pick(infos)->mutable_type()->mutable_tensor_type()->mutable_shape();
    switch (below(4)) {
      case 0:
        if (shape->dim_size() == 0) shape->add_dim()->set_dim_value(interestingInt());
        else pick(*shape->mutable_dim()).set_dim_value(interestingInt());
        break;
      case 1:
        if (shape->dim_size() > 0) pick(*shape->mutable_dim()).set_dim_param("N");
        break;
      case 2:
        shape->add_dim()->set_dim_value(1 + static_cast<int64_t>(below(8)));
        break;
      default:
        if (shape->dim_size() > 0 && chance(50)) shape->mutable_dim()->RemoveLast();
        else shape->Clear();
    }
    return true;
  }

  bool mutateDataType() {
    GraphProto& graph = anyGraph();
    if (chance(60)) {
      TensorProto* tensor = anyInitializer(graph);
      if (!tensor) return false;
      if (chance(50)) {
        // Same element size, so the byte count still matches and the tensor loads with another meaning.
        moveToRawData(*tensor);
        const int bytes = elementBytes(tensor->data_type());
        std::vector<int> sameSize;
        for (int type : kDataTypes)
          if (elementBytes(type) == bytes) sameSize.push_back(type);
        if (!sameSize.empty()) tensor->set_data_type(pick(sameSize));
      } else {
        tensor->set_data_type(pick(kDataTypes));
      }
      return true;
    }
    std::vector<ValueInfoProto*> infos;
    for (auto* list : {graph.mutable_input(), graph.mutable_output(), graph.mutable_value_info()})
      for (ValueInfoProto& info : *list) infos.push_back(&info);
    if (infos.empty()) return false;
    pick(infos)->mutable_type()->mutable_tensor_type()->set_elem_type(pick(kDataTypes));
    return true;
  }

  void setAttributeValue(AttributeProto& attr, AttrKind kind) {
    attr.clear_f();
    attr.clear_i();
    attr.clear_ints();
    attr.clear_s();
    switch (kind) {
      case AttrKind::Float:
        attr.set_type(AttributeProto::FLOAT);
        attr.set_f(static_cast<float>(interestingFloat()));
        break;
      case AttrKind::Int:
        attr.set_type(AttributeProto::INT);
        attr.set_i(interestingInt());
        break;
      case AttrKind::Ints: {
        attr.set_type(AttributeProto::INTS);
        const std::size_t length = below(7);
        if (std::string(attr.name()) == "perm" && chance(60)) {
          std::vector<int64_t> perm(length);
          for (std::size_t i = 0; i < length; ++i) perm[i] = static_cast<int64_t>(i);
          std::shuffle(perm.begin(), perm.end(), rng_);
          for (int64_t axis : perm) attr.add_ints(axis);
        } else {
          for (std::size_t i = 0; i < length; ++i) attr.add_ints(interestingInt());
        }
        break;
      }
      case AttrKind::String: {
        static const std::vector<const char*> autoPads = {"NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID", "bogus"};
        attr.set_type(AttributeProto::STRING);
        attr.set_s(pick(autoPads));
        break;
      }
    }
  }

  bool mutateAttribute() {
    NodeProto* node = anyNode(anyGraph());
    if (!node) return false;
    const AttrSpec& spec = pick(kAttributes);
    AttributeProto* attr = nullptr;
    if (node->attribute_size() > 0 && chance(50)) {
      const int index = static_cast<int>(below(static_cast<std::size_t>(node->attribute_size())));
      if (chance(10)) {  // gone
        node->mutable_attribute()->erase(node->mutable_attribute()->begin() + index);
        return true;
      }
      attr = node->mutable_attribute(index);
      for (const AttrSpec& known : kAttributes)
        if (attr->name() == known.name) {
          setAttributeValue(*attr, chance(90) ? known.kind : spec.kind);  // sometimes the wrong type
          return true;
        }
      if (attr->type() == AttributeProto::TENSOR && attr->has_t()) return mutateTensorValues(*attr->mutable_t());
      setAttributeValue(*attr, spec.kind);
      return true;
    }
    attr = node->add_attribute();  // may duplicate a name the node already has
    attr->set_name(spec.name);
    setAttributeValue(*attr, spec.kind);
    return true;
  }

  bool shuffleNodes() {
    GraphProto& graph = anyGraph();
    auto& nodes = *graph.mutable_node();
    if (nodes.size() < 2) return false;
    switch (below(3)) {
      case 0: std::shuffle(nodes.begin(), nodes.end(), rng_); break;
      case 1: std::reverse(nodes.begin(), nodes.end()); break;
      default: nodes.SwapElements(static_cast<int>(below(nodes.size())), static_cast<int>(below(nodes.size())));
    }
    return true;
  }

  bool collideNames() {
    GraphProto& graph = anyGraph();
    const std::vector<std::string> names = valueNames(graph);
    NodeProto* node = anyNode(graph);
    if (!node || names.empty()) return false;
    switch (below(7)) {
      case 0:  // two producers of one value
        if (node->output_size() == 0) return false;
        pick(*node->mutable_output()) = pick(names);
        break;
      case 1:  // read another value (possibly its own output: a cycle)
        if (node->input_size() == 0) return false;
        pick(*node->mutable_input()) = pick(names);
        break;
      case 2:
        if (node->input_size() == 0) return false;
        pick(*node->mutable_input()) = chance(50) ? std::string() : freshName("undefined");
        break;
      case 3: {
        NodeProto* other = anyNode(graph);
        node->set_name(other->name());
        break;
      }
      case 4: {
        TensorProto* tensor = anyInitializer(graph);
        if (!tensor) return false;
        tensor->set_name(pick(names));
        break;
      }
      case 5:
        if (graph.output_size() == 0) return false;
        pick(*graph.mutable_output()).set_name(pick(names));
        break;
      default:
        if (graph.input_size() == 0) return false;
        pick(*graph.mutable_input()).set_name(pick(names));
    }
    return true;
  }

  // NaN, infinities, zeros, negative variance (also exactly -epsilon, which makes var + eps zero).
  bool mutateTensorValues(TensorProto& tensor, bool isVariance = false) {
    const std::size_t count = floatElementCount(tensor);
    if (count == 0) return false;
    auto specialValue = [&] {
      if (isVariance && chance(50)) return chance(50) ? -1e-5 : -static_cast<double>(below(4) + 1);
      return interestingFloat();
    };
    if (chance(25)) {
      const double value = specialValue();
      for (std::size_t i = 0; i < count; ++i) setFloatElement(tensor, i, value);
    } else {
      setFloatElement(tensor, below(count), specialValue());
    }
    return true;
  }

  bool mutateBatchNormParams() {
    std::vector<NodeProto*> batchNorms;
    for (GraphProto* graph : graphs_)
      for (NodeProto& node : *graph->mutable_node())
        if (node.op_type() == "BatchNormalization") batchNorms.push_back(&node);
    if (batchNorms.empty()) {
      TensorProto* tensor = anyInitializer(anyGraph());
      return tensor && mutateTensorValues(*tensor);
    }
    NodeProto& bn = *pick(batchNorms);
    if (bn.input_size() < 2) return false;
    const int slot = 1 + static_cast<int>(below(static_cast<std::size_t>(bn.input_size() - 1)));
    TensorProto* tensor = initializerNamed(bn.input(slot));
    if (!tensor) return false;
    return mutateTensorValues(*tensor, slot == 4);
  }

  bool mutateTensorBytes() {
    TensorProto* tensor = anyInitializer(anyGraph());
    if (!tensor) return false;
    moveToRawData(*tensor);
    std::string& raw = *tensor->mutable_raw_data();
    switch (below(5)) {
      case 0: raw.resize(below(raw.size() + 1)); break;   // truncated
      case 1: raw.append(1 + below(16), '\x7f'); break;  // extended
      case 2: raw.append(raw); break;
      case 3: tensor->add_float_data(1.0f); break;        // raw_data and a typed field both set
      default: {
        // libFuzzer's byte mutations on the values, same length or not.
        const std::size_t maxSize = raw.size() + 8;
        raw.resize(maxSize);
        raw.resize(mutateBytes_(reinterpret_cast<uint8_t*>(&raw[0]), maxSize - 8, maxSize));
      }
    }
    return true;
  }

  bool mutateExternalData() {
    TensorProto* tensor = anyInitializer(anyGraph());
    if (!tensor) return false;
    static const std::vector<const char*> locations = {
        ScratchDir::kWeightsFileName, ScratchDir::kWeightsFileName, "./weights.bin", "sub/../weights.bin",
        "missing.bin", "../weights.bin", "/etc/hostname", "", "input.onnx", ".", "weights.bin/x"};
    static const std::vector<const char*> numbers = {
        "0", "4", "-1", "abc", "", "18446744073709551615", "9223372036854775807", "4294967296", "65532", "65536",
        "1e3", " 8", "+4"};
    moveToRawData(*tensor);
    const int64_t needed = static_cast<int64_t>(tensor->raw_data().size());
    tensor->clear_raw_data();
    tensor->clear_external_data();
    tensor->set_data_location(chance(90) ? TensorProto::EXTERNAL : TensorProto::DEFAULT);
    auto add = [tensor](const std::string& key, const std::string& value) {
      auto* entry = tensor->add_external_data();
      entry->set_key(key);
      entry->set_value(value);
    };
    add("location", pick(locations));
    if (chance(60) && needed <= ScratchDir::kWeightsBytes) {
      // Inside weights.bin and of the right length: loads, and the rules read these bytes.
      const int64_t offset = 4 * static_cast<int64_t>(below(static_cast<std::size_t>(
                                       (ScratchDir::kWeightsBytes - needed) / 4 + 1)));
      add("offset", std::to_string(offset));
      add("length", std::to_string(needed));
    } else {
      if (chance(80)) add("offset", pick(numbers));
      if (chance(80)) add("length", pick(numbers));
    }
    if (chance(10)) add("checksum", "0");
    if (chance(10)) add("location", pick(locations));  // a key given twice
    return true;
  }

  bool mutateOpType() {
    NodeProto* node = anyNode(anyGraph());
    if (!node) return false;
    if (chance(15)) {
      static const std::vector<const char*> domains = {"", "ai.onnx", "com.microsoft", "ai.onnx.ml", "custom"};
      node->set_domain(pick(domains));
    } else {
      node->set_op_type(pick(kOpTypes));
    }
    return true;
  }

  bool mutateNodeArity() {
    GraphProto& graph = anyGraph();
    NodeProto* node = anyNode(graph);
    if (!node) return false;
    const std::vector<std::string> names = valueNames(graph);
    switch (below(4)) {
      case 0:
        if (node->input_size() == 0) return false;
        node->mutable_input()->RemoveLast();
        break;
      case 1: node->add_input(names.empty() || chance(30) ? std::string() : pick(names)); break;
      case 2:
        if (node->output_size() == 0) return false;
        if (chance(50)) node->mutable_output()->RemoveLast();
        else pick(*node->mutable_output()).clear();  // an omitted optional output
        break;
      default: node->add_output(freshName("extra"));
    }
    return true;
  }

  bool mutateOpsets() {
    static const std::vector<int64_t> versions = {1, 6, 7, 9, 11, 13, 14, 15, 17, 21, 0, -1, 1000};
    static const std::vector<int64_t> irVersions = {3, 4, 6, 7, 8, 9, 0, -1, 100};
    switch (below(4)) {
      case 0: model_.set_ir_version(pick(irVersions)); break;
      case 1: {
        auto* opset = model_.opset_import_size() > 0 ? &pick(*model_.mutable_opset_import())
                                                     : model_.add_opset_import();
        opset->set_version(pick(versions));
        break;
      }
      case 2: {
        auto* opset = model_.add_opset_import();  // a second entry for a domain
        opset->set_domain(chance(50) ? "" : "ai.onnx");
        opset->set_version(pick(versions));
        break;
      }
      default:
        if (model_.opset_import_size() == 0) return false;
        model_.mutable_opset_import()->RemoveLast();
    }
    return true;
  }

  bool mutateGraphInterface() {
    GraphProto& graph = anyGraph();
    switch (below(4)) {
      case 0: {  // an initializer that is also an input: overridable at run time
        TensorProto* tensor = anyInitializer(graph);
        if (!tensor) return false;
        ValueInfoProto* input = graph.add_input();
        input->set_name(tensor->name());
        auto* type = input->mutable_type()->mutable_tensor_type();
        type->set_elem_type(tensor->data_type());
        for (int64_t dim : tensor->dims()) type->mutable_shape()->add_dim()->set_dim_value(dim);
        break;
      }
      case 1: {  // a layer's output becomes a graph output too
        NodeProto* node = anyNode(graph);
        if (!node || node->output_size() == 0) return false;
        graph.add_output()->set_name(pick(*node->mutable_output()));
        break;
      }
      case 2:
        if (graph.output_size() == 0) return false;
        graph.mutable_output()->RemoveLast();
        break;
      default:
        if (graph.input_size() == 0) return false;
        graph.mutable_input()->erase(graph.mutable_input()->begin() + static_cast<long>(below(graph.input_size())));
    }
    return true;
  }

  // Consumers of `value` in `graph` read `replacement` instead (the value's producer is left as it is).
  static void redirectUses(GraphProto& graph, const std::string& value, const std::string& replacement,
                           const NodeProto* except) {
    for (NodeProto& node : *graph.mutable_node()) {
      if (&node == except) continue;
      for (std::string& input : *node.mutable_input())
        if (input == value) input = replacement;
    }
    for (ValueInfoProto& output : *graph.mutable_output())
      if (output.name() == value) output.set_name(replacement);
  }

  bool mutateStructure() {
    GraphProto& graph = anyGraph();
    if (graph.node_size() == 0) return false;
    const int index = static_cast<int>(below(static_cast<std::size_t>(graph.node_size())));
    NodeProto* node = graph.mutable_node(index);
    switch (below(3)) {
      case 0: {  // a copy of a node writing fresh outputs
        NodeProto copy = *node;
        for (std::string& output : *copy.mutable_output()) output = freshName(output);
        copy.set_name(freshName(copy.name()));
        *graph.add_node() = copy;
        break;
      }
      case 1:  // gone: its consumers read nothing
        graph.mutable_node()->erase(graph.mutable_node()->begin() + index);
        break;
      default: {  // a layout op after the node, between it and its consumers
        if (node->output_size() == 0 || node->output(0).empty()) return false;
        const std::string value = node->output(0);
        const std::string moved = freshName(value);
        NodeProto layout;
        layout.set_op_type(pick(kLayoutOps));
        layout.set_name(freshName(layout.op_type()));
        layout.add_input(value);
        layout.add_output(moved);
        if (layout.op_type() == "Reshape") {
          TensorProto shape;
          shape.set_name(freshName("shape"));
          shape.set_data_type(TensorProto::INT64);
          const std::size_t rank = 1 + below(4);
          shape.add_dims(static_cast<int64_t>(rank));
          for (std::size_t i = 0; i < rank; ++i) shape.add_int64_data(chance(50) ? 0 : interestingInt());
          *graph.add_initializer() = shape;
          layout.add_input(shape.name());
        } else if (layout.op_type() != "Identity") {
          AttributeProto* attr = layout.add_attribute();
          attr->set_name(layout.op_type() == "Transpose" ? "perm" : layout.op_type() == "Flatten" ? "axis" : "axes");
          setAttributeValue(*attr, layout.op_type() == "Flatten" ? AttrKind::Int : AttrKind::Ints);
        }
        redirectUses(graph, value, moved, nullptr);
        *graph.add_node() = layout;
      }
    }
    return true;
  }

  // Channel count a BN after this layer would have, from its constant weight; 0 when unknown.
  int64_t layerChannels(const NodeProto& layer) {
    if (layer.input_size() < 2) return 0;
    const TensorProto* weight = initializerNamed(layer.input(1));
    if (!weight || weight->dims_size() < 1) return 0;
    const std::string& op = layer.op_type();
    if (op == "Conv") return weight->dims(0);
    if (op == "ConvTranspose" && weight->dims_size() >= 2) {
      int64_t group = 1;
      for (const auto& attr : layer.attribute())
        if (attr.name() == "group") group = attr.i();
      int64_t channels = 0;
      return __builtin_mul_overflow(weight->dims(1), group, &channels) ? 0 : channels;
    }
    if (op == "Gemm" && weight->dims_size() == 2) {
      for (const auto& attr : layer.attribute())
        if (attr.name() == "transB" && attr.i() != 0) return weight->dims(0);
      return weight->dims(1);
    }
    if (op == "MatMul") return weight->dims(weight->dims_size() - 1);
    return 0;
  }

  // A BN with fresh parameters after a node (sized for the layer when its weight says how many channels).
  bool insertBatchNorm() {
    GraphProto& graph = anyGraph();
    NodeProto* node = anyNode(graph);
    if (!node || node->output_size() == 0 || node->output(0).empty()) return false;
    int64_t channels = layerChannels(*node);
    if (channels <= 0 || channels > 4096 || chance(10)) channels = 1 + static_cast<int64_t>(below(8));
    const std::string value = node->output(0);
    const std::string normalized = freshName(value);
    NodeProto bn;
    bn.set_op_type("BatchNormalization");
    bn.set_name(freshName("bn"));
    bn.add_input(value);
    const double ranges[4][2] = {{-2, 2}, {-1, 1}, {-1, 1}, {0.1, 3}};
    for (int i = 0; i < 4; ++i) {
      TensorProto param = floatTensor(freshName("bn_param"), {channels}, ranges[i][0], ranges[i][1]);
      bn.add_input(param.name());
      *graph.add_initializer() = param;
    }
    bn.add_output(normalized);
    if (chance(30)) {
      AttributeProto* epsilon = bn.add_attribute();
      epsilon->set_name("epsilon");
      setAttributeValue(*epsilon, AttrKind::Float);
    }
    redirectUses(graph, value, normalized, nullptr);
    *graph.add_node() = bn;
    return true;
  }

  // A constant Add or Mul after a node (bias-add, scale-fold), in a per-channel shape or one that is not.
  bool insertChannelConstantOp() {
    GraphProto& graph = anyGraph();
    NodeProto* node = anyNode(graph);
    if (!node || node->output_size() == 0 || node->output(0).empty()) return false;
    int64_t channels = layerChannels(*node);
    if (channels <= 0 || channels > 4096) channels = 1 + static_cast<int64_t>(below(8));
    const std::vector<std::vector<int64_t>> shapes = {
        {channels}, {1, channels, 1, 1}, {channels, 1, 1}, {1, channels}, {1}, {}, {channels, 1}};
    const std::string value = node->output(0);
    const std::string result = freshName(value);
    TensorProto constant = floatTensor(freshName("const"), pick(shapes), -2, 2);
    NodeProto op;
    op.set_op_type(chance(50) ? "Add" : "Mul");
    op.set_name(freshName(op.op_type()));
    if (chance(20)) {  // swapped operands
      op.add_input(constant.name());
      op.add_input(value);
    } else {
      op.add_input(value);
      op.add_input(constant.name());
    }
    op.add_output(result);
    *graph.add_initializer() = constant;
    redirectUses(graph, value, result, nullptr);
    *graph.add_node() = op;
    return true;
  }

  ModelProto& model_;
  std::mt19937 rng_;
  MutateBytes mutateBytes_;
  std::vector<GraphProto*> graphs_;
  int nextName_ = 0;
};

}  // namespace

void mutateModel(onnx::ModelProto& model, uint32_t seed, MutateBytes mutateBytes) {
  if (!model.has_graph()) model.mutable_graph();
  Mutator(model, seed, mutateBytes).run();
}

}  // namespace bnfold::fuzz
