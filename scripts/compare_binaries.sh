#!/bin/bash
# Runs two builds of bnfold on the same models and says where their outputs differ: the rewritten model, the JSON
# report, stdout, stderr and the exit code of `fold` (default rules, --rules all, --verify, both) and of `check`.
# For a change that must not change behaviour (a refactoring): every line must read "same".
#
# Models: models/*.onnx, the ones scripts/gen_models.py, scripts/gen_exporter_models.py and
# scripts/gen_edge_models.py write (opset-6 legacy broadcasting, refusals, a bad tensor).
#
# Usage: scripts/compare_binaries.sh BASE_BNFOLD NEW_BNFOLD   (exit 1 when anything differs)
set -euo pipefail

if [[ $# -ne 2 ]]; then
  echo "usage: $0 BASE_BNFOLD NEW_BNFOLD" >&2
  exit 2
fi
base=$(realpath "$1")
new=$(realpath "$2")
repo=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

mkdir -p "$work/models/sample" "$work/models/generated" "$work/models/exporter" "$work/models/edge"
cp "$repo"/models/*.onnx "$work/models/sample/"
/usr/bin/python3 "$repo/scripts/gen_models.py" --out "$work/models/generated" >/dev/null
/usr/bin/python3 "$repo/scripts/gen_exporter_models.py" "$work/models/exporter" >/dev/null
/usr/bin/python3 "$repo/scripts/gen_edge_models.py" "$work/models/edge" >/dev/null

variants=("default|" "all|--rules all" "verify|--verify" "all-verify|--rules all --verify"
          "freeze|--freeze-train-bn --rules all" "constants|--input-defaults-are-constant --rules all"
          "keep-constants|--rules all --keep-op Constant")

# Runs one binary in its own folder so that relative output names are the same for both.
run() {
  local binary=$1 dir=$2
  shift 2
  mkdir -p "$dir"
  (cd "$dir" && set +e && "$binary" "$@" >stdout 2>stderr; echo $? >exit_code)
}

differences=0
compared=0
while IFS= read -r model; do
  label=${model#"$work/models/"}
  for variant in "${variants[@]}"; do
    name=${variant%%|*}
    read -r -a flags <<<"${variant#*|}"
    for side in base new; do
      binary=$base
      [[ $side == new ]] && binary=$new
      run "$binary" "$work/run/$side" fold "$model" -o out.onnx --report report.json --jobs 1 "${flags[@]}"
    done
    compared=$((compared + 1))
    if diff -r "$work/run/base" "$work/run/new" >/dev/null; then
      echo "same      $label [$name]"
    else
      echo "DIFFERENT $label [$name]: $(diff -rq "$work/run/base" "$work/run/new" | tr '\n' ' ')"
      differences=$((differences + 1))
    fi
    rm -rf "$work/run"
  done
done < <(find "$work/models" -name '*.onnx' | sort)

# `check` over each folder: its summary names every model and every finding.
for folder in "$work"/models/*/; do
  for format in text github json; do
    for side in base new; do
      binary=$base
      [[ $side == new ]] && binary=$new
      run "$binary" "$work/run/$side" check "$folder" --format "$format"
    done
    compared=$((compared + 1))
    label="check $(basename "$folder") --format $format"
    if diff -r "$work/run/base" "$work/run/new" >/dev/null; then
      echo "same      $label"
    else
      echo "DIFFERENT $label"
      differences=$((differences + 1))
    fi
    rm -rf "$work/run"
  done
done

echo "$compared comparisons, $differences different"
[[ $differences -eq 0 ]]
