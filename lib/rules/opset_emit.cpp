#include "opset_emit.h"

namespace bnfold::rules {

int64_t modelOpset(Rewriter& rewriter) { return rewriter.model().opsetVersion(""); }

onnx::AttributeProto intAttribute(const std::string& name, int64_t value) {
  onnx::AttributeProto attribute;
  attribute.set_name(name);
  attribute.set_type(onnx::AttributeProto::INT);
  attribute.set_i(value);
  return attribute;
}

onnx::AttributeProto floatAttribute(const std::string& name, float value) {
  onnx::AttributeProto attribute;
  attribute.set_name(name);
  attribute.set_type(onnx::AttributeProto::FLOAT);
  attribute.set_f(value);
  return attribute;
}

onnx::AttributeProto intsAttribute(const std::string& name, const std::vector<int64_t>& values) {
  onnx::AttributeProto attribute;
  attribute.set_name(name);
  attribute.set_type(onnx::AttributeProto::INTS);
  for (int64_t value : values) attribute.add_ints(value);
  return attribute;
}

std::vector<onnx::AttributeProto> broadcastAttributes(int64_t opset, std::optional<int64_t> axis) {
  if (opset >= kNumpyBroadcastOpset) return {};
  std::vector<onnx::AttributeProto> attributes{intAttribute("broadcast", 1)};
  if (axis) attributes.push_back(intAttribute("axis", *axis));
  return attributes;
}

namespace {

// One op whose int64 list (`axes` or `shape`) is an attribute before `inputFromOpset` and an input from then on.
Value* emitWithIntList(Rewriter& rewriter, const Node* anchor, const std::string& opType, const Value* input,
                       const std::string& listName, const std::vector<int64_t>& list, int64_t inputFromOpset,
                       std::vector<onnx::AttributeProto> attributes, const EmitNames& names, const std::string& step) {
  std::vector<const Value*> inputs{input};
  if (modelOpset(rewriter) >= inputFromOpset) {
    const auto size = static_cast<int64_t>(list.size());
    inputs.push_back(rewriter.addInitializer(*anchor->graph(), Tensor::fromInt64s("", {size}, list),
                                             names.value(step + "_" + listName)));
  } else {
    attributes.push_back(intsAttribute(listName, list));
  }
  Node* node =
      rewriter.createNode(anchor, opType, inputs, {names.value(step)}, names.node(step), std::move(attributes));
  return node->output(0);
}

}  // namespace

Value* emitReduceMean(Rewriter& rewriter, const Node* anchor, const Value* input, const std::vector<int64_t>& axes,
                      bool keepDims, const EmitNames& names, const std::string& step) {
  return emitWithIntList(rewriter, anchor, "ReduceMean", input, "axes", axes, kReduceMeanAxesInputOpset,
                         {intAttribute("keepdims", keepDims ? 1 : 0)}, names, step);
}

Value* emitUnsqueeze(Rewriter& rewriter, const Node* anchor, const Value* input, const std::vector<int64_t>& axes,
                     const EmitNames& names, const std::string& step) {
  return emitWithIntList(rewriter, anchor, "Unsqueeze", input, "axes", axes, kSqueezeAxesInputOpset, {}, names, step);
}

Value* emitSqueeze(Rewriter& rewriter, const Node* anchor, const Value* input, const std::vector<int64_t>& axes,
                   const EmitNames& names, const std::string& step) {
  return emitWithIntList(rewriter, anchor, "Squeeze", input, "axes", axes, kSqueezeAxesInputOpset, {}, names, step);
}

Value* emitReshape(Rewriter& rewriter, const Node* anchor, const Value* input, const std::vector<int64_t>& shape,
                   const EmitNames& names, const std::string& step) {
  return emitWithIntList(rewriter, anchor, "Reshape", input, "shape", shape, kReshapeShapeInputOpset, {}, names, step);
}

}  // namespace bnfold::rules
