#pragma once
/// \file
/// Loading and saving models. Loading checks the structure (every input defined, tensor sizes agree with
/// their dims, external data stays inside the model's folder) and throws bnfold::InvalidModelError naming the file.
/// Saving is atomic: temp files in the destination folder, renamed into place when complete (see
/// bnfold/io/atomic_file.h for links, devices and FIFOs).

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include <onnx/onnx_pb.h>

#include "bnfold/ir/model.h"

namespace bnfold {

struct LoadOptions {
  /// Give unnamed nodes a stable unique name ("<OpType>_<n>", numbered in graph order).
  bool nameUnnamedNodes = true;
};

/// Reads an ONNX model file (external data is referenced, not read, until a tensor's bytes are needed).
std::unique_ptr<Model> loadModel(const std::string& path, const LoadOptions& options = {});
/// Builds the IR from an in-memory ModelProto (consumed). `sourceName` names it in errors; `baseDir` is where
/// external data would be found.
std::unique_ptr<Model> modelFromProto(onnx::ModelProto&& proto, const std::string& sourceName = "<memory>",
                                      const std::string& baseDir = ".", const LoadOptions& options = {});

/// Builds the IR from a serialized ModelProto held in memory; the model copies the bytes (the caller may free them
/// at once; bnfold/io/borrowed_model.h lends them instead). Throws bnfold::InvalidModelError naming `sourceName`.
std::unique_ptr<Model> modelFromBytes(std::string_view bytes, const std::string& sourceName = "<memory>",
                                      const std::string& baseDir = ".", const LoadOptions& options = {});

struct SaveOptions {
  /// Tensors at least this large that were external in the input stay external; new tensors derived from
  /// external ones are written externally too. The data file is "<output file name>.data" beside the model.
  std::string externalDataFileName;  ///< empty: "<output file name>.data"
  /// When the tensors kept inline would exceed protobuf's 2 GiB limit, move the largest ones out.
  bool spillLargeModels = true;
};

/// Writes the model to `path` atomically. The model itself is not changed.
void saveModel(Model& model, const std::string& path, const SaveOptions& options = {});
/// Serializes the model into memory: `allocate(size)` returns where to write its `size` bytes, so a caller can
/// hand over its own buffer. External tensors stay references to the input's files. Throws bnfold::Error over
/// protobuf's 2 GiB limit.
void serializeModel(Model& model, const std::function<char*(std::size_t)>& allocate);
/// The model as a ModelProto (external tensors stay references to the input's files).
onnx::ModelProto modelToProto(Model& model);

}  // namespace bnfold
