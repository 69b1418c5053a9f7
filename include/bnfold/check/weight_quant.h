#pragma once
/// \file
/// What folding costs a model that will be quantized to int8 weights: for each layer with a constant weight
/// (Conv, ConvTranspose, Gemm, MatMul), the spread of its output channels' weight ranges and the weight-domain
/// SQNR of symmetric int8 quantization with one step per tensor against one step per output channel
/// (10 log10(||W||^2 / ||W - Q(W)||^2), step max|W| / 127). `bnfold info --weights` prints these for the model as
/// loaded, after `fold` and after `fold --equalize`, and `check` makes a weight-quant-gap finding of each layer
/// that equalization leaves more than kWeightQuantGapLimitDb below per channel.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "bnfold/check/fold.h"

namespace bnfold {

class Model;
class Report;

/// A per-tensor SQNR this far (dB) below per-channel is what info lists and check reports.
inline constexpr double kWeightQuantGapLimitDb = 10.0;

/// "12.3" (one decimal), "inf" for +infinity: how info and check print decibels.
std::string formatDecibels(double db);

/// One layer's int8 weight figures. SQNRs are +infinity when quantization loses nothing.
struct LayerWeightQuant {
  std::string node;
  std::string op;
  std::string graph;
  int64_t channels = 0;      ///< output channels
  int64_t deadChannels = 0;  ///< output channels whose weights are all zero
  /// max / min of the live output channels' max|W_c|: 1 with one live channel, 0 with none.
  double rangeSpread = 0;
  double perTensorSqnrDb = 0;
  double perChannelSqnrDb = 0;
  double gapDb = 0;  ///< perChannelSqnrDb - perTensorSqnrDb (0 when both are infinite)
};

/// The layers of every graph of `model` as it is now, in graph order, whose weight is a floating constant under
/// `options` (Constant nodes and constant chains count, as for the rules; --keep does not hide a layer).
std::vector<LayerWeightQuant> layerWeightQuant(Model& model, const RuleOptions& options);

/// LayerLeftOff::reason for a layer whose output channels equalize did scale, not enough.
inline constexpr const char* kLeftOffEqualizedStillOff = "equalized-still-off";
/// LayerLeftOff::reason for a layer equalize gives no reason for (inside a chain, with nothing after it that
/// takes its scales); the message names what reads its output.
inline constexpr const char* kLeftOffNoLink = "no-link";

/// A layer still more than kWeightQuantGapLimitDb off after equalization, and why equalize did not reach it.
struct LayerLeftOff {
  std::string node;
  std::string op;
  std::string graph;
  double gapDb = 0;
  /// Why: the reason code of equalize's `not_equalized` entry for the layer (residual-add,
  /// non-homogeneous-activation, not-improving, ...), else of its match at the layer when that names one
  /// (reader-not-layer, kept-by-user, ...); else kLeftOffEqualizedStillOff or kLeftOffNoLink.
  std::string reason;
  std::string message;  ///< one line for people
};

/// The layers of `layers` (figures of `model` after a run with equalize) whose gap exceeds the limit, with the
/// reason from that run's `report`. `options` tells which nodes the user kept.
std::vector<LayerLeftOff> layersLeftOff(const std::vector<LayerWeightQuant>& layers, Model& model,
                                        const Report& report, const RuleOptions& options);

/// One layer through the three states; a state where the layer does not exist (a MatMul that became a Gemm has
/// a new name) or has no constant weight is empty.
struct LayerWeightQuantStates {
  std::string node;
  std::string op;
  std::string graph;
  std::optional<LayerWeightQuant> loaded, folded, equalized;
};

struct WeightQuantSummary {
  std::vector<LayerWeightQuantStates> layers;
  std::vector<LayerLeftOff> leftOff;
};

/// What `bnfold info --weights` prints. Folds `model` in memory with `options`' non-equalize rules, then runs the
/// rules that follow the fixed point (equalize, added when absent) on the result, taking the figures after each
/// step: `model` ends equalized. --verify is not run (options.verify is ignored).
WeightQuantSummary summarizeWeightQuant(Model& model, const DriverOptions& options);

}  // namespace bnfold
