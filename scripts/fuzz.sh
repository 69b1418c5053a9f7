#!/usr/bin/env bash
# Fuzz bnfold: configure and build the clang AddressSanitizer + UndefinedBehaviorSanitizer + libFuzzer build if
# needed, write seed corpora into the build folder, run each fuzz target for a bounded time, then run the saved
# regression corpora (CTest label `fuzz`). Exit 1 on any finding, naming the file that reproduces it.
#
# Usage: scripts/fuzz.sh [SECONDS_PER_TARGET] [BUILD_DIR]      (defaults: 60, build-sanitize)
#   FUZZ_WORKERS=N     parallel fuzzing processes per target, 1 or 2 (default 1); the targets run at once
#   FUZZ_TARGETS="..." targets to run (default: bnfold_fuzz_load_save bnfold_fuzz_graph)
#   FUZZ_KEEP_GOING=1  for long campaigns: keep fuzzing after a finding (each is saved; needs FUZZ_WORKERS)
#
# The corpus grows in BUILD_DIR/fuzz/corpus/TARGET across runs; findings go to BUILD_DIR/fuzz/findings/TARGET.
# Reproduce one:  BUILD_DIR/test/fuzz/TARGET FILE        Keep it: copy it into test/fuzz/regressions/TARGET/.
set -euo pipefail

readonly source_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
seconds="${1:-60}"
build_dir="${2:-build-sanitize}"
workers="${FUZZ_WORKERS:-1}"
targets=(${FUZZ_TARGETS:-bnfold_fuzz_load_save bnfold_fuzz_graph})

log() { printf 'fuzz: %s\n' "$*" >&2; }
die() { printf 'fuzz: error: %s\n' "$*" >&2; exit 2; }

[[ "$seconds" =~ ^[1-9][0-9]*$ ]] || die "SECONDS_PER_TARGET must be a positive number of seconds, not '$seconds'"
[[ "$workers" == 1 || "$workers" == 2 ]] || die "FUZZ_WORKERS must be 1 or 2 (the CI machine has 2 cores)"
[[ "$build_dir" = /* ]] || build_dir="$source_dir/$build_dir"

# libFuzzer ships in libclang-rt-14-dev (libclang_rt.fuzzer-x86_64.a), which is all -fsanitize=fuzzer needs.
"$source_dir/scripts/setup_deps.sh" clang-14 libclang-rt-14-dev || die "installing the Debian packages failed"

# ---- configure and build (only the fuzz targets) ----
# The same configuration as scripts/sanitize.sh, so both share build-sanitize and CI compiles the library once.
mkdir -p "$build_dir"
log "configuring $build_dir (clang-14, address,undefined, BNFOLD_FUZZ=ON)"
CC=clang-14 CXX=clang++-14 cmake -S "$source_dir" -B "$build_dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DBNFOLD_WARNINGS_AS_ERRORS=ON -DBNFOLD_SANITIZE=address,undefined -DBNFOLD_FUZZ=ON -DBNFOLD_PYTHON=OFF \
    >"$build_dir/fuzz-configure.log" 2>&1 \
    || { tail -n 30 "$build_dir/fuzz-configure.log" >&2; die "cmake configure failed"; }
log "building ${targets[*]}"
nice -n 5 cmake --build "$build_dir" --parallel 2 --target "${targets[@]}" >"$build_dir/fuzz-build.log" 2>&1 \
    || { tail -n 30 "$build_dir/fuzz-build.log" >&2; die "the build failed (full log: $build_dir/fuzz-build.log)"; }

# ---- seed corpora: the sample models, the exporter-shaped test models, a few libonnx-testdata models ----
fuzz_dir="$build_dir/fuzz"
seeds="$fuzz_dir/seeds"
if [[ ! -f "$seeds/.complete" ]]; then
    log "writing seed corpora into $seeds"
    rm -rf "$seeds"
    mkdir -p "$seeds/exporters"
    cp "$source_dir"/models/*.onnx "$seeds/"
    /usr/bin/python3 "$source_dir/scripts/gen_exporter_models.py" "$seeds/exporters" >/dev/null \
        || die "scripts/gen_exporter_models.py failed"
    testdata=/usr/share/libonnx-testdata/data/node
    for name in test_batchnorm_epsilon test_batchnorm_example_training_mode test_if test_loop11 test_scan9_sum; do
        [[ -f "$testdata/$name/model.onnx" ]] && cp "$testdata/$name/model.onnx" "$seeds/$name.onnx"
    done
    touch "$seeds/.complete"
fi

# Every report prints a stack, so a finding in the mutator (which leaves no input to replay) can be located too.
export UBSAN_OPTIONS="print_stacktrace=1${UBSAN_OPTIONS:+:$UBSAN_OPTIONS}"
declare -A max_len=([bnfold_fuzz_load_save]=65536 [bnfold_fuzz_graph]=262144)
failed=()
start_marker="$(mktemp)"
trap 'rm -f "$start_marker"' EXIT

# The targets fuzz at the same time (one process each on the 2-core machine), so CI waits $seconds s, not one
# period per target.
declare -A pid_of status_of
for target in "${targets[@]}"; do
    executable="$build_dir/test/fuzz/$target"
    corpus="$fuzz_dir/corpus/$target"
    findings="$fuzz_dir/findings/$target"
    mkdir -p "$corpus" "$findings"
    flags=(-max_total_time="$seconds" -max_len="${max_len[$target]:-262144}" -rss_limit_mb=2048 -timeout=30
           -artifact_prefix="$findings/" -print_final_stats=1)
    if [[ "$workers" == 2 || "${FUZZ_KEEP_GOING:-0}" == 1 ]]; then
        flags+=(-fork="$workers")
        [[ "${FUZZ_KEEP_GOING:-0}" == 1 ]] && flags+=(-ignore_crashes=1 -ignore_timeouts=1 -ignore_ooms=1)
    fi
    log "$target: fuzzing for $seconds s (log: $fuzz_dir/$target.log)"
    # The first folder collects new inputs; the seed folders are only read.
    (cd "$fuzz_dir" && exec nice -n 5 "$executable" "${flags[@]}" "$corpus" "$seeds" "$seeds/exporters") \
        >"$fuzz_dir/$target.log" 2>&1 &
    pid_of[$target]=$!
done
for target in "${targets[@]}"; do
    status_of[$target]=0
    wait "${pid_of[$target]}" || status_of[$target]=$?
done

for target in "${targets[@]}"; do
    executable="$build_dir/test/fuzz/$target"
    corpus="$fuzz_dir/corpus/$target"
    findings="$fuzz_dir/findings/$target"
    status="${status_of[$target]}"
    executions="$(grep -oE '^#[0-9]+' "$fuzz_dir/$target.log" | tail -n 1 | tr -d '#')"
    new_findings="$(find "$findings" -type f -newer "$start_marker" | sort)"
    log "$target: ${executions:-0} executions in $seconds s, corpus $(find "$corpus" -type f | wc -l) files" \
        "($(du -sk "$corpus" | cut -f1) KiB), exit status $status"
    if [[ "$status" != 0 || -n "$new_findings" ]]; then
        failed+=("$target")
        grep -E 'ERROR: |FINDING|runtime error|SUMMARY' "$fuzz_dir/$target.log" | head -n 20 >&2 || true
        for file in $new_findings; do log "$target: FINDING saved in $file (reproduce: $executable $file)"; done
    fi
done

log "running the regression corpora (ctest -L fuzz)"
ctest --test-dir "$build_dir" -L fuzz --output-on-failure >&2 || failed+=("regression corpora")

if ((${#failed[@]})); then
    log "FAILED: ${failed[*]}"
    exit 1
fi
log "no findings"
