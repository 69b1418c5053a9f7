#pragma once
// Graph-level mutations of an ONNX ModelProto for the structure-aware fuzz target: each keeps the model a valid
// protobuf but changes what bnfold's loader and rules have to cope with (dims, types, attributes, node order,
// names, BN parameters, tensor bytes, external data, opsets, op types, graph interface).

#include <cstddef>
#include <cstdint>
#include <random>

#include <onnx/onnx_pb.h>

namespace bnfold::fuzz {

/// Applies one to three random mutations (the same `seed` gives the same mutations). `mutateBytes` is
/// libFuzzer's byte mutator (LLVMFuzzerMutate), used on tensor bytes.
void mutateModel(onnx::ModelProto& model, uint32_t seed,
                 std::size_t (*mutateBytes)(uint8_t* data, std::size_t size, std::size_t maxSize));

}  // namespace bnfold::fuzz
