#pragma once
/// \file
/// Loading a serialized model from a buffer the caller lends: no copy of its large tensors, which is what makes a
/// fold of a model in memory as fast as a fold of a file.

#include <memory>
#include <string>
#include <string_view>

#include "bnfold/io/model_io.h"

namespace bnfold {

/// modelFromBytes without the copy: the model's large tensors keep pointing into `bytes`, which must stay alive and
/// unchanged until the model is destroyed (the Python module lends an immutable `bytes` object for one call).
std::unique_ptr<Model> modelFromBorrowedBytes(std::string_view bytes, const std::string& sourceName = "<memory>",
                                              const std::string& baseDir = ".", const LoadOptions& options = {});

}  // namespace bnfold
