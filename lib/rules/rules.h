#pragma once
// Factories for the built-in rules (one .cpp per rule in this folder); the list is in builtin_rules.cpp.

#include <memory>

#include "bnfold/rewrite/rule.h"

namespace bnfold::rules {
std::unique_ptr<Rule> makeFoldBatchNormIntoLayer();    // bn-fold
std::unique_ptr<Rule> makeFreezeTrainingBatchNorm();   // train-bn-freeze
std::unique_ptr<Rule> makeExpandTrainingBatchNorm();   // train-bn-expand
std::unique_ptr<Rule> makeAbsorbAddIntoBias();         // bias-add
std::unique_ptr<Rule> makeFoldScaleIntoWeights();      // scale-fold
std::unique_ptr<Rule> makeFoldBatchNormForward();      // bn-forward
std::unique_ptr<Rule> makeFoldNormAffineForward();     // norm-affine-forward
std::unique_ptr<Rule> makeEqualizeLayers();          // equalize (off by default; after the others' fixed point)
std::unique_ptr<Rule> makeReplaceRelu6WithRelu();    // relu6-to-relu (off by default; changes the function)
std::unique_ptr<Rule> makeAbsorbHighBias();          // absorb-high-bias (off by default; after equalize)
std::unique_ptr<Rule> makeDecomposeBatchNorm();        // bn-decompose (off by default)
std::unique_ptr<Rule> makeDecomposeNorm();             // norm-decompose (off by default)
std::unique_ptr<Rule> makeFuseNormalization();         // norm-fuse
}  // namespace bnfold::rules
