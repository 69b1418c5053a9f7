#pragma once
// Shared by the libFuzzer targets: a private scratch folder per fuzzing process (loadModel reads files, and
// reading a regular file is the path real models take), the rule options a run uses, and how a finding ends
// the process.

#include <cstddef>
#include <cstdint>
#include <string>

#include "bnfold/check/fold.h"

namespace bnfold::fuzz {

/// Inputs above this size are rejected at once: per-input work stays bounded, and real findings are small.
inline constexpr std::size_t kMaxInputBytes = std::size_t{1} << 20;

/// A folder of this process (created on first use, removed at exit) holding the model under test, the saved
/// model and a small external-data file, `weights.bin`, that mutated models may point into.
class ScratchDir {
 public:
  static ScratchDir& get();
  ~ScratchDir();
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;

  const std::string& path() const { return path_; }
  std::string inputPath() const { return path_ + "/input.onnx"; }
  std::string outputPath() const { return path_ + "/output.onnx"; }
  /// Size of weights.bin, so a mutator can write external-data entries that lie inside it.
  static constexpr int64_t kWeightsBytes = 64 * 1024;
  static constexpr const char* kWeightsFileName = "weights.bin";

  /// Replaces input.onnx with these bytes (and removes outputs of the previous input).
  void writeInput(const uint8_t* data, std::size_t size) const;

 private:
  ScratchDir();
  std::string path_;
};

/// The rules a run applies. Most inputs get `bnfold fold`'s defaults; a quarter each get every rule, or the
/// defaults with initializers that are also graph inputs taken as constants, or every rule with training BN
/// frozen: chosen from the input's bytes so a reproducer always runs the same way.
DriverOptions driverOptionsFor(const uint8_t* data, std::size_t size);

/// A finding that is not a crash by itself (an unexpected exception, a saved model that does not reload):
/// prints it and aborts, so libFuzzer saves the input as a crash.
[[noreturn]] void reportFinding(const std::string& stage, const std::string& what);

}  // namespace bnfold::fuzz
