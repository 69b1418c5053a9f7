#!/usr/bin/env bash
# Sets everything up (scripts/setup.sh) and runs every test: the Catch2 unit and rule tests with their ONNX Runtime
# checks, and the conformance run over Debian's libonnx-testdata, all through CTest.
# Extra arguments go to ctest (e.g. scripts/test.sh -R bn-fold).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build_dir="${BNFOLD_BUILD_DIR:-$root/build}"
# Not eval "$(setup.sh)": eval would hide a failed setup or build (the substitution's status is lost).
setup_exports="$("$root/scripts/setup.sh")"
eval "$setup_exports"
export BNFOLD_ORT_NODE_MODULES
cd "$build_dir"
ctest --output-on-failure --parallel "${BNFOLD_JOBS:-$(nproc 2>/dev/null || echo 2)}" "$@"
