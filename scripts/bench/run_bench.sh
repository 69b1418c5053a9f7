#!/usr/bin/env bash
# The bnfold benchmark in one command: builds bnfold and the floor in RelWithDebInfo (build-bench/), makes sure
# ONNX Runtime for Node is installed, then runs scripts/bench/run_bench.py (generates the models into bench-out/,
# measures, prints the table). See BENCHMARKS.md.
#
# Usage: scripts/bench/run_bench.sh [--quick] [--runs N] [--models resnet50,large] [--skip-large] [--json FILE] ...
#        (every option goes to run_bench.py; scripts/bench/run_bench.py --help lists them)
# Environment: BNFOLD_BENCH_BUILD_DIR (default build-bench), BNFOLD_JOBS (build parallelism, default 2).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
build_dir="${BNFOLD_BENCH_BUILD_DIR:-$root/build-bench}"

cmake -S "$root" -B "$build_dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
make -C "$build_dir" -j"${BNFOLD_JOBS:-2}" --no-print-directory bnfold_cli bnfold_proto_roundtrip bnfold_rule_phase >/dev/null

if [[ " $* " != *" --no-ort "* ]]; then
    BNFOLD_ORT_NODE_MODULES="$("$root/scripts/ort/ensure_ort.sh" | tail -n 1)"
    export BNFOLD_ORT_NODE_MODULES
fi
exec /usr/bin/python3 "$root/scripts/bench/run_bench.py" --build-dir "$build_dir" "$@"
