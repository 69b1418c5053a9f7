#!/usr/bin/env bash
# Sets everything up and builds the CLI alone (scripts/setup.sh bnfold_cli: no test suite), then folds a sample
# model and proves the result in ONNX Runtime:
#   bnfold info -> bnfold fold (report) -> ORT comparison of original and folded model.
# Usage: scripts/demo.sh [MODEL.onnx]   (default: models/resnet_block.onnx); output goes to out/.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build_dir="${BNFOLD_BUILD_DIR:-$root/build}"
model="${1:-$root/models/resnet_block.onnx}"
# Not eval "$(setup.sh)": eval would hide a failed setup or build (the substitution's status is lost).
setup_exports="$("$root/scripts/setup.sh" bnfold_cli)"
eval "$setup_exports"
export BNFOLD_ORT_NODE_MODULES
bnfold="$build_dir/apps/bnfold"
name="$(basename "$model" .onnx)"
mkdir -p "$root/out"
folded="$root/out/$name.folded.onnx"
report="$root/out/$name.report.json"

echo "== bnfold info $model"
"$bnfold" info "$model"
echo
echo "== bnfold fold $model -o $folded --report $report"
"$bnfold" fold "$model" -o "$folded" --report "$report" -v
echo
echo "== after folding"
"$bnfold" info "$folded"
echo
echo "== ONNX Runtime: original vs folded (same seeded random inputs)"
node "$root/scripts/ort/compare.js" "$model" "$folded" --atol 1e-5 --rtol 1e-4
echo
echo "report: $report"
