#!/usr/bin/env bash
# conformance.js keeps one `bnfold_onnx_check --serve` for the whole pass. This runs a few models against a stand-in
# checker that crashes on one output and hangs on another, and requires exactly those two checks to fail (with
# the reason) while every other check, before and after, is still answered by a restarted checker.
# Usage: checker_server.sh SOURCE_DIR BNFOLD TESTDATA_DIR
set -euo pipefail
source_dir="$1" bnfold="$2" data="$3"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
cat >"$work/checker" <<'CHECKER'
#!/usr/bin/env bash
[[ "$1" == --serve ]] || exit 2
while read -r path; do
  case "$path" in
    */test_acos.rules-default.onnx) kill -SEGV $$ ;;
    */test_acosh.rules-none.onnx) exec sleep 60 ;;
  esac
  echo ok
done
CHECKER
chmod +x "$work/checker"
node "$source_dir/scripts/ort/conformance.js" --bnfold "$bnfold" --checker "$work/checker" --data "$data" \
  --suites node --filter test_aco --rules none --rules default --timeout 3 --results-only --out "$work/out" \
  >"$work/log" 2>&1 || { cat "$work/log"; exit 1; }
/usr/bin/python3 - "$work/out/conformance.json" <<'CHECK'
import json, sys
runs = json.load(open(sys.argv[1]))["runs"]
expected = {("default", "node/test_acos"): "the checker crashed (SIGSEGV)",
            ("none", "node/test_acosh"): "the checker timed out after 3 s"}
failed = {}
checked = 0
records = 0
for run in runs:
    rules = run["summary"]["rules"]
    for record in run["records"]:
        records += 1
        if record["status"] == "fail":
            failed[(rules, record["model"])] = " ".join(record["failures"])
        elif record["status"] == "pass":
            checked += 1
problems = []
if set(failed) != set(expected):
    problems.append(f"failed {sorted(failed)}, expected {sorted(expected)}")
for key, why in expected.items():
    if key in failed and why not in failed[key]:
        problems.append(f"{key}: '{failed[key]}' does not say '{why}'")
if records < 8 or checked != records - len(expected):
    problems.append(f"{checked} of {records} records passed: the checker was not started again after it died")
if problems:
    sys.exit("\n".join(problems))
print(f"checker server: {checked} checks passed, the crash and the hang each failed one check")
CHECK
