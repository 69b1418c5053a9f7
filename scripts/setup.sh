#!/usr/bin/env bash
# Sets up everything bnfold needs on a Debian 12 machine and builds it. Safe to run again: each step only does
# what is missing.
#   1. Debian packages (scripts/setup_deps.sh: apt-get update + install, only when something is missing)
#   2. ONNX Runtime for Node.js, the numeric oracle, cached outside the source tree (scripts/ort/ensure_ort.sh)
#   3. CMake configure + build into build/ (or $BNFOLD_BUILD_DIR): every target, or only the targets given
#      (scripts/demo.sh builds just the CLI, `bnfold_cli`, and no test)
# Usage: scripts/setup.sh [TARGET...]
# Prints `export BNFOLD_ORT_NODE_MODULES=...` as its last line so callers can eval it.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build_dir="${BNFOLD_BUILD_DIR:-$root/build}"
jobs="${BNFOLD_JOBS:-$(nproc 2>/dev/null || echo 2)}"

log() { printf 'setup: %s\n' "$*" >&2; }

"$root/scripts/setup_deps.sh" >&2  # apt-get prints to stdout; only the last line below is for callers
ort_modules="$("$root/scripts/ort/ensure_ort.sh" | tail -n 1)"
log "ONNX Runtime for Node.js: $ort_modules"

log "building in $build_dir"
cmake -S "$root" -B "$build_dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DBNFOLD_WARNINGS_AS_ERRORS=ON >&2
target_args=()
for target in "$@"; do target_args+=(--target "$target"); done
cmake --build "$build_dir" --parallel "$jobs" "${target_args[@]}" >&2
log "built ${*:-everything} in $build_dir"
printf 'export BNFOLD_ORT_NODE_MODULES=%q\n' "$ort_modules"
