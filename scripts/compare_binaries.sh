#!/usr/bin/env bash
# Compares two bnfold binaries byte for byte: `fold` outputs and --report JSON (default rules, all rules, --verify,
# --input-defaults-are-constant) and `check --format json`, on models/*.onnx and on freshly generated sample and
# exporter-shaped models. For a change that must not change any output (a refactoring).
#
# Usage: scripts/compare_binaries.sh BEFORE_BNFOLD AFTER_BNFOLD     exit 0 when everything is identical
set -euo pipefail
if [ $# -ne 2 ]; then echo "usage: $0 BEFORE_BNFOLD AFTER_BNFOLD" >&2; exit 2; fi
before="$(realpath "$1")"
after="$(realpath "$2")"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

mkdir -p "$work/models/sample" "$work/models/generated" "$work/models/exporters"
cp "$root"/models/*.onnx "$work/models/sample/"
/usr/bin/python3 "$root/scripts/gen_models.py" --out "$work/models/generated" >/dev/null
/usr/bin/python3 "$root/scripts/gen_exporter_models.py" "$work/models/exporters" >/dev/null

variants=("default::" "all::--rules all" "verify::--verify" "verify-all::--rules all --verify"
          "defaults-constant::--input-defaults-are-constant" "bias-add-only::--rules bias-add" "none::--rules none"
          "keep-bn::--keep-op BatchNormalization" "decompose::--rules +bn-decompose")
compared=0 differing=0
# Runs one binary in its own folder on the same relative paths, so that paths in reports are the same.
run() {
  local binary=$1 side=$2 model=$3 name=$4 flags=$5
  local dir="$work/$side"
  mkdir -p "$dir/out"
  (cd "$dir" && "$binary" fold "../models/$model" -o "out/$name.onnx" --report "out/$name.report.json" \
      $flags >"out/$name.stdout" 2>"out/$name.stderr"; echo "exit $?" >"out/$name.exit") || true
}
check() {
  local binary=$1 side=$2 model=$3 name=$4
  (cd "$work/$side" && "$binary" check "../models/$model" --format json >"out/$name.check.json" 2>/dev/null;
   echo "exit $?" >"out/$name.check.exit") || true
}
while IFS= read -r model; do
  base="${model//\//_}"
  for variant in "${variants[@]}"; do
    label="${variant%%::*}"
    flags="${variant#*::}"
    run "$before" before "$model" "$base.$label" "$flags"
    run "$after" after "$model" "$base.$label" "$flags"
  done
  check "$before" before "$model" "$base"
  check "$after" after "$model" "$base"
done < <(cd "$work/models" && find . -name '*.onnx' | sed 's|^\./||' | sort)

for file in $(cd "$work/before/out" && ls); do
  compared=$((compared + 1))
  if ! cmp -s "$work/before/out/$file" "$work/after/out/$file"; then
    differing=$((differing + 1))
    echo "differs: $file" >&2
  fi
done
models=$(cd "$work/models" && find . -name '*.onnx' | wc -l)
echo "$models models, $compared files compared, $differing differ"
[ "$differing" -eq 0 ]
