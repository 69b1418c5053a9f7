#!/usr/bin/env bash
# Where no thread can start (a container's process limit), `fold --equalize` does the work of its second thread
# itself and writes the same model as it does with threads, and a batch (`fold DIR --out-dir`, `--jobs` from the
# cores) folds its models one after the other, as does bnfold.fold_many when given the Python package's folder.
# Usage: thread_limit_test.sh BNFOLD PYTHON [PACKAGE_DIR]
# Needs root, to run bnfold as the user nobody under `ulimit -u 1`; else skipped (exit 77).
set -euo pipefail
bnfold=$1
python=$2
package=${3:-}
if [[ $(id -u) != 0 ]] || ! id nobody >/dev/null 2>&1; then
  echo "skipped: needs root and the user nobody"
  exit 77
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
chmod 777 "$work"

# 1x1 -> Relu -> dense 3x3 -> Relu -> 1x1, large enough for both of equalize's second-thread paths, with the
# per-channel spread equalize acts on.
"$python" - "$work/chain.onnx" <<'PY'
import sys
import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

rng = np.random.default_rng(7)
def weight(name, out_channels, in_channels, kernel):
    spread = 10.0 ** rng.uniform(-1.5, 0.5, size=(out_channels, 1, 1, 1))
    values = rng.standard_normal((out_channels, in_channels, kernel, kernel)) * spread
    return numpy_helper.from_array(values.astype(np.float32), name)
inits = [weight("w1", 256, 128, 1), weight("w2", 256, 256, 3), weight("w3", 512, 256, 1)]
nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], name="conv1"),
         helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
         helper.make_node("Conv", ["r1", "w2"], ["c2"], name="conv2", pads=[1, 1, 1, 1]),
         helper.make_node("Relu", ["c2"], ["r2"], name="relu2"),
         helper.make_node("Conv", ["r2", "w3"], ["y"], name="conv3")]
graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 128, 8, 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 512, 8, 8])], inits)
onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), sys.argv[1])
PY
chmod 644 "$work/chain.onnx"

"$bnfold" fold "$work/chain.onnx" -o "$work/threads.onnx" --equalize --report "$work/threads.json"
grep -q '"layer2": "conv3"' "$work/threads.json" || { echo "FAIL: the chain was not equalized"; exit 1; }
# exec: the shell itself is the one process the limit allows. No leak check: it needs a thread of its own.
su nobody -s /bin/bash -c "ulimit -u 1; ASAN_OPTIONS=detect_leaks=0 exec '$bnfold' fold '$work/chain.onnx' \
  -o '$work/limited.onnx' --equalize"
cmp "$work/threads.onnx" "$work/limited.onnx"
mkdir "$work/in" "$work/batch-threads" "$work/batch-limited"
cp "$work/chain.onnx" "$work/in/a.onnx"
cp "$work/chain.onnx" "$work/in/b.onnx"
chmod -R a+rwX "$work"
"$bnfold" fold "$work/in" --out-dir "$work/batch-threads" --jobs 2 --equalize -q
su nobody -s /bin/bash -c "ulimit -u 1; ASAN_OPTIONS=detect_leaks=0 exec '$bnfold' fold '$work/in' \
  --out-dir '$work/batch-limited' --jobs 2 --equalize -q"
for model in a b; do cmp "$work/batch-threads/$model.onnx" "$work/batch-limited/$model.onnx"; done
if [[ -n "$package" ]]; then
  mkdir "$work/py-limited"
  chmod a+rwX "$work/py-limited"
  fold_many="import bnfold, sys; r = bnfold.fold_many([sys.argv[1]], out_dir=sys.argv[2], jobs=2, equalize=True)
assert all(result.ok for result in r), [result.error for result in r]"
  su nobody -s /bin/bash -c "ulimit -u 1; PYTHONPATH='$package' exec '$python' -c '$fold_many' '$work/in' \
    '$work/py-limited'"
  for model in a b; do cmp "$work/batch-threads/$model.onnx" "$work/py-limited/$model.onnx"; done
fi
# The limit holds: a program under it cannot start a thread (bash would retry a fork for 15 s; Python fails at once).
if su nobody -s /bin/bash -c "ulimit -u 1; exec '$python' -c 'import threading; threading.Thread().start()'" \
    2>/dev/null; then
  echo "FAIL: ulimit -u 1 did not stop a thread, so the test proves nothing"
  exit 1
fi
echo "ok: the same models with and without threads"
