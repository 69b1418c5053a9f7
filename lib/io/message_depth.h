#pragma once
// How deeply a serialized ModelProto nests its messages, read without recursion: when protobuf refuses a model,
// this tells "nested deeper than the limit" apart from "corrupt".

#include <optional>

namespace bnfold {

/// Protobuf's default recursion limit, which every parse of a model keeps: a model nesting messages deeper is
/// refused (ONNX files in practice nest a handful of subgraphs, three message levels each).
constexpr int kMaxMessageDepth = 100;

/// The deepest nesting of messages (the ModelProto itself is level 1) in the ModelProto read from `fd` (from
/// offset 0), walking the wire format with an explicit stack guided by the ONNX schema. Nothing when the bytes
/// are not a well-formed ModelProto.
std::optional<int> modelMessageDepth(int fd);

}  // namespace bnfold
