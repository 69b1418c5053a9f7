#!/usr/bin/env bash
# A model that needs more memory than the process may have gets the one-line error every bad input gets: the file
# named, "out of memory", exit 2, nothing written, the input untouched; in fold, info, check and a batch fold.
# The model is tiny: a LayerNorm over 2^28 declared elements whose one-value gamma and beta norm-fuse expands,
# allowed by --max-constant-size 4096 (MiB), under a 300 MB address-space limit.
# Usage: out_of_memory_test.sh BNFOLD PYTHON   (not for sanitizer builds: their shadow memory needs the address space)
set -euo pipefail
bnfold=$1
python=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir "$work/in" "$work/out"

"$python" - "$work/in/layernorm.onnx" <<'PY'
import sys
import onnx
from onnx import parser
model = parser.parse_model('''<ir_version: 8, opset_import: ["" : 13]>
g (float[2,4,268435456] x) => (float[2,4,268435456] y)
<float[1] gamma = {1.5}, float[1] beta = {0.5}, float eps = {1e-5}, float two = {2.0}>
{
  mean = ReduceMean <axes = [-1]> (x)
  d = Sub (x, mean)
  sq = Pow (d, two)
  var = ReduceMean <axes = [-1]> (sq)
  ve = Add (var, eps)
  s = Sqrt (ve)
  n = Div (d, s)
  g = Mul (n, gamma)
  y = Add (g, beta)
}''')
onnx.checker.check_model(model)
onnx.save(model, sys.argv[1])
PY
model=$work/in/layernorm.onnx
cp "$model" "$work/original.onnx"

fail() { echo "FAIL: $*"; exit 1; }
# Runs bnfold under the limit; its stderr in $work/err, its exit code in $code.
limited() {
  code=0
  (ulimit -v 300000; exec "$bnfold" "$@") >"$work/stdout" 2>"$work/err" || code=$?
}

# Within the default --max-constant-size the chain stays (constant-too-large) and the fold succeeds.
limited fold "$model" -o "$work/out/default.onnx"
[[ $code == 0 ]] || fail "default fold exited $code: $(cat "$work/err")"

limited fold "$model" -o "$work/out/folded.onnx" --max-constant-size 4096
[[ $code == 2 ]] || fail "fold exited $code, expected 2"
[[ $(wc -l <"$work/err") == 1 ]] || fail "fold printed more than one line: $(cat "$work/err")"
grep -q "^bnfold: error: $model: out of memory" "$work/err" || fail "fold's error: $(cat "$work/err")"
[[ ! -e $work/out/folded.onnx ]] || fail "fold left an output"

limited info --weights "$model" --max-constant-size 4096
[[ $code == 2 ]] || fail "info exited $code, expected 2"
grep -q "^bnfold: error: $model: out of memory" "$work/err" || fail "info's error: $(cat "$work/err")"

limited check "$model" --max-constant-size 4096
[[ $code == 2 ]] || fail "check exited $code, expected 2"
grep -q "invalid-model.*out of memory" "$work/stdout" || fail "check's finding: $(cat "$work/stdout" "$work/err")"

limited fold "$work/in" --out-dir "$work/out/batch" --max-constant-size 4096
[[ $code == 2 ]] || fail "batch fold exited $code, expected 2"
grep -q "failed.*layernorm.onnx: out of memory" "$work/stdout" "$work/err" || fail "batch's error: $(cat "$work/stdout" "$work/err")"
[[ -z $(find "$work/out/batch" -name '*.onnx' 2>/dev/null) ]] || fail "batch fold left an output"

cmp -s "$model" "$work/original.onnx" || fail "the input changed"
[[ $(ls "$work/in") == layernorm.onnx ]] || fail "files beside the input: $(ls "$work/in")"
echo "ok"
