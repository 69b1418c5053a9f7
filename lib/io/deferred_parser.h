#pragma once
// Parses a model file without reading the main graph's large raw_data payloads: each such tensor gets a
// FileRange pointing into the file instead. Everything else is parsed by protobuf as usual.

#include <memory>
#include <string>
#include <vector>

#include <onnx/onnx_pb.h>

#include "bnfold/ir/tensor.h"

namespace bnfold {

struct DeferredModel {
  onnx::ModelProto proto;  ///< the whole model except the main graph's initializers
  std::vector<std::unique_ptr<Tensor>> mainInitializers;  ///< in file order
};

/// raw_data payloads at least this large stay in the file.
constexpr uint32_t kDeferredRawDataThreshold = 4096;

/// Parses the open file `fd` (positioned at 0). Returns false when the bytes are not a well-formed
/// ModelProto or use a layout this parser does not handle (the caller then parses it the ordinary way).
bool parseDeferred(int fd, const std::string& path, const std::string& baseDir, DeferredModel& out);

}  // namespace bnfold
