#!/usr/bin/env bash
# Builds bnfold with AddressSanitizer + UndefinedBehaviorSanitizer (LeakSanitizer included) and runs the whole
# suite on that build: the unit, rule and CLI tests (the CLI they spawn is instrumented too), the exporter models
# and a sample of the libonnx-testdata conformance run. Any report fails the test that caused it.
# Usage: scripts/sanitize.sh [extra ctest arguments]
# Environment: BNFOLD_SANITIZE_BUILD_DIR (default build-sanitize), BNFOLD_CONFORMANCE_SAMPLE (default 4: every
# conformance model of the ops the rules rewrite, and every 4th of the others), BNFOLD_JOBS.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build_dir="${BNFOLD_SANITIZE_BUILD_DIR:-$root/build-sanitize}"
jobs="${BNFOLD_JOBS:-$(nproc 2>/dev/null || echo 2)}"
sample="${BNFOLD_CONFORMANCE_SAMPLE:-4}"

log() { printf 'sanitize: %s\n' "$*" >&2; }

# clang, so the same build also holds the libFuzzer targets (scripts/fuzz.sh reuses it; their regression corpora
# run in this suite); its sanitizer and libFuzzer runtimes are libclang-rt-14-dev. No Python module: an
# AddressSanitizer library cannot be loaded into an uninstrumented python3.
"$root/scripts/setup_deps.sh" clang-14 libclang-rt-14-dev >&2
ort_modules="$("$root/scripts/ort/ensure_ort.sh" | tail -n 1)"
export BNFOLD_ORT_NODE_MODULES="$ort_modules"

log "building in $build_dir (clang-14, address,undefined, -O1, line tables, libFuzzer targets)"
# An installed ccache is used as in setup.sh.
launcher=()
if [[ "${BNFOLD_CCACHE:-1}" != 0 && -z "${CMAKE_CXX_COMPILER_LAUNCHER:-}" ]] && command -v ccache >/dev/null; then
    launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache)
fi
CC=clang-14 CXX=clang++-14 cmake -S "$root" -B "$build_dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo "${launcher[@]}" \
    -DBNFOLD_WARNINGS_AS_ERRORS=ON -DBNFOLD_SANITIZE=address,undefined -DBNFOLD_FUZZ=ON \
    -DBNFOLD_CONFORMANCE_SAMPLE="$sample" -DBNFOLD_PYTHON=OFF >&2
# Only what the suite runs: the tests, the CLI and checker they spawn, the fuzz targets whose regression corpora
# it replays (scripts/fuzz.sh fuzzes with them next). The benchmark tools are left out.
cmake --build "$build_dir" --parallel "$jobs" \
    --target bnfold_tests bnfold_cli bnfold_onnx_check bnfold_fuzz_load_save bnfold_fuzz_graph >&2

# Leaks count as findings; every report prints a stack.
export ASAN_OPTIONS="detect_leaks=1:check_initialization_order=1:strict_init_order=1${ASAN_OPTIONS:+:$ASAN_OPTIONS}"
export UBSAN_OPTIONS="print_stacktrace=1${UBSAN_OPTIONS:+:$UBSAN_OPTIONS}"
cd "$build_dir"
ctest --output-on-failure --parallel "$jobs" "$@"
