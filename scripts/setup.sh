#!/usr/bin/env bash
# Sets up everything bnfold needs on a Debian 12 machine and builds it. Safe to run again: each step only does
# what is missing.
#   1. Debian packages (scripts/setup_deps.sh: apt-get update + install, only when something is missing)
#   2. ONNX Runtime for Node.js, the numeric oracle, cached outside the source tree (scripts/ort/ensure_ort.sh)
#   3. CMake configure + build into build/ (or $BNFOLD_BUILD_DIR): every target, the Python module included, or only
#      the targets given (scripts/demo.sh builds just the CLI, `bnfold_cli`, and no test)
#   4. When every target was built: the Python module installed for Debian's python3 into the user's site-packages
#      (pip install --user; set BNFOLD_PIP_INSTALL=0 to skip; docs/python.md has the other ways)
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
# Debian's interpreter, which has python3-onnx: a python3 earlier on PATH (pyenv, conda) may not.
python="${BNFOLD_PYTHON:-/usr/bin/python3}"
# An installed ccache is used unless the caller chose a launcher (or BNFOLD_CCACHE=0); it is not a dependency.
# The library and the tests compile with precompiled headers, which ccache caches only with this sloppiness:
# the launcher carries it, so a build in this folder started by hand caches too, whatever ccache's own config says.
launcher=()
if [[ "${BNFOLD_CCACHE:-1}" != 0 && -z "${CMAKE_CXX_COMPILER_LAUNCHER:-}" ]] && command -v ccache >/dev/null; then
    sloppiness="$(ccache --get-config sloppiness 2>/dev/null || true)"
    sloppiness="${sloppiness// /}"
    ccache_launcher="env;CCACHE_SLOPPINESS=${sloppiness:+$sloppiness,}pch_defines,time_macros;ccache"
    launcher=("-DCMAKE_CXX_COMPILER_LAUNCHER=$ccache_launcher" "-DCMAKE_C_COMPILER_LAUNCHER=$ccache_launcher")
fi
cmake -S "$root" -B "$build_dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DBNFOLD_WARNINGS_AS_ERRORS=ON \
    -DPYTHON_EXECUTABLE="$python" "${launcher[@]}" >&2
target_args=()
for target in "$@"; do target_args+=(--target "$target"); done
cmake --build "$build_dir" --parallel "$jobs" "${target_args[@]}" >&2
log "built ${*:-everything} in $build_dir"
if [[ $# -eq 0 && "${BNFOLD_PIP_INSTALL:-1}" != 0 ]]; then
    # Offline (--no-index, --no-build-isolation: Debian's setuptools and pybind11), reusing this build folder.
    # Debian marks its Python "externally managed" (PEP 668); a --user install leaves Debian's packages alone.
    BNFOLD_BUILD_DIR="$build_dir" BNFOLD_JOBS="$jobs" "$python" -m pip install --quiet --user \
        --break-system-packages --no-build-isolation --no-index --no-deps "$root" >&2
    log "installed the Python module for $python: import bnfold"
fi
printf 'export BNFOLD_ORT_NODE_MODULES=%q\n' "$ort_modules"
