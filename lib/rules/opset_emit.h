#pragma once
// Emitting ops whose form changed across opsets, in the form valid at the model's own ai.onnx opset (read from
// the rewriter's model), without asking libonnx's schemas: models newer than the libonnx we build against
// (opset 18 and later) must be handled too.
//   ReduceMean: `axes` attribute up to opset 17, optional int64 input from 18.
//   Unsqueeze / Squeeze: `axes` attribute up to opset 12, int64 input from 13.
//   Reshape: `shape` attribute up to opset 4, int64 input from 5.
//   Add / Sub / Mul / Div, and Gemm's C: broadcast only with `broadcast=1` up to opset 6, numpy-style from 7.
// Axes and shapes that become inputs are written as new int64 initializers next to the anchor node.
// Each function creates one node right before `anchor` and returns its single output.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "bnfold/rewrite/rewriter.h"
#include "rewrite/op_versions.h"

namespace bnfold::rules {

/// The ai.onnx opset of the model the rewriter works on.
int64_t modelOpset(Rewriter& rewriter);

/// Attribute builders.
onnx::AttributeProto intAttribute(const std::string& name, int64_t value);
onnx::AttributeProto floatAttribute(const std::string& name, float value);
onnx::AttributeProto intsAttribute(const std::string& name, const std::vector<int64_t>& values);

/// The attributes a binary op (Add, Sub, Mul, Div) or a Gemm needs at `opset` to broadcast its second operand
/// (Gemm: C): none from opset 7, where broadcasting is numpy's; before it `broadcast=1`, plus `axis` when the
/// operand lines up with that axis rather than with the trailing ones (a [C] vector against NCHW: axis 1).
std::vector<onnx::AttributeProto> broadcastAttributes(int64_t opset, std::optional<int64_t> axis = std::nullopt);

/// Names for what one rewrite emits: nodes are called "<base>/<step>" and their outputs "<base>_<step>".
struct EmitNames {
  std::string nodeBase;
  std::string valueBase;
  std::string node(const std::string& step) const { return nodeBase + "/" + step; }
  std::string value(const std::string& step) const { return valueBase + "_" + step; }
};

/// Y = ReduceMean(input) over `axes` (non-negative), keeping the reduced axes as size 1 when `keepDims`.
Value* emitReduceMean(Rewriter& rewriter, const Node* anchor, const Value* input, const std::vector<int64_t>& axes,
                      bool keepDims, const EmitNames& names, const std::string& step);
/// Inserts size-1 axes at `axes` (positions in the output).
Value* emitUnsqueeze(Rewriter& rewriter, const Node* anchor, const Value* input, const std::vector<int64_t>& axes,
                     const EmitNames& names, const std::string& step);
/// Removes the size-1 axes `axes`.
Value* emitSqueeze(Rewriter& rewriter, const Node* anchor, const Value* input, const std::vector<int64_t>& axes,
                   const EmitNames& names, const std::string& step);
/// Reshapes to `shape` (ONNX Reshape semantics: 0 copies the input dim, -1 is inferred).
Value* emitReshape(Rewriter& rewriter, const Node* anchor, const Value* input, const std::vector<int64_t>& shape,
                   const EmitNames& names, const std::string& step);

}  // namespace bnfold::rules
