#!/usr/bin/env bash
# Installs the built library into a temporary prefix, builds test/install/consumer against it with
# find_package(bnfold) as README.md shows, and runs it on a sample model: the folded model must exist, load
# in bnfold, and have no BatchNormalization left.
#   run_install_test.sh BUILD_DIR SOURCE_DIR BNFOLD_EXECUTABLE [CXX_COMPILER [SANITIZERS]]
# The consumer is built with the library's compiler, and linked with its sanitizers when it was built with some
# (a sanitized static library needs the sanitizer runtime in the program).
set -euo pipefail
build_dir="$1" source_dir="$2" bnfold="$3" compiler="${4:-}" sanitizers="${5:-}"
consumer_flags=()
[[ -n "$compiler" ]] && consumer_flags+=(-DCMAKE_CXX_COMPILER="$compiler")
[[ -n "$sanitizers" ]] && consumer_flags+=(-DCMAKE_EXE_LINKER_FLAGS="-fsanitize=$sanitizers")
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

cmake --install "$build_dir" --prefix "$work/prefix" >/dev/null
cmake -S "$source_dir/test/install/consumer" -B "$work/build" -DCMAKE_PREFIX_PATH="$work/prefix" \
  -DCMAKE_BUILD_TYPE=Release "${consumer_flags[@]}" >/dev/null
cmake --build "$work/build" >/dev/null
out="$("$work/build/app" "$source_dir/models/resnet_block.onnx" "$work/folded.onnx")"
echo "$out"
[[ "$out" =~ ^rewrites:\ [1-9] ]] || { echo "FAIL: the consumer made no rewrite" >&2; exit 1; }
grep -q '^error foldable-bn: ' <<<"$out" || { echo "FAIL: the consumer got no foldable-bn finding" >&2; exit 1; }
info="$("$bnfold" info --json "$work/folded.onnx")"
left="$(node -e 'console.log(JSON.parse(require("fs").readFileSync(0, "utf8")).batch_normalization.count)' <<<"$info")"
[[ "$left" == 0 ]] || { echo "FAIL: $left BatchNormalization left in the consumer's output" >&2; exit 1; }
echo "install test passed"
