#!/usr/bin/python3
"""Run `bnfold fold --verify` on models and check that every rewrite was verified and passed.

For each model: fold exits 0, writes the model and the report, the report's `verification` summary counts as many
rewrites as the report has rewrite entries, none failed, and every rewrite entry carries a passing `verify` object.
Prints one line per model (rewrites verified, largest relative error) and a total.

Usage: scripts/verify_models.py --bnfold PATH [--out DIR] [--rules R] [--min-rewrites N] MODEL.onnx...
Exit: 0 all good; 1 a model failed (each problem named); 2 bad arguments.
"""

import argparse
import json
import pathlib
import subprocess
import sys
import tempfile

REWRITE_SECTIONS = ("folds", "bias_absorbed", "scale_folded", "decomposed", "expanded", "frozen")


def check_model(bnfold, model, out_dir, rules):
    stem = pathlib.Path(model).stem + "-" + pathlib.Path(model).parent.name
    out_model = out_dir / f"{stem}.onnx"
    out_report = out_dir / f"{stem}.json"
    command = [bnfold, "fold", str(model), "-o", str(out_model), "--report", str(out_report), "--verify", "-q"]
    if rules:
        command += ["--rules", rules]
    run = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if run.returncode != 0:
        return [f"bnfold exited {run.returncode}: {run.stderr.strip()}"], 0, 0.0
    problems = []
    if not out_model.is_file():
        problems.append("no output model written")
    report = json.loads(out_report.read_text())
    summary = report.get("verification")
    if not isinstance(summary, dict):
        return problems + ["the report has no verification summary"], 0, 0.0
    entries = [(section, entry) for section in REWRITE_SECTIONS for entry in report.get(section, [])]
    worst = 0.0
    for section, entry in entries:
        verify = entry.get("verify")
        if not isinstance(verify, dict):
            problems.append(f"{section} entry of rule {entry.get('rule')} has no verify object")
        elif not verify.get("passed"):
            problems.append(f"{section} entry of rule {entry.get('rule')} failed: {json.dumps(verify)}")
        else:
            worst = max(worst, float(verify.get("max_rel_error", 0.0)))
    if summary.get("failed") != 0:
        problems.append(f"verification summary counts {summary.get('failed')} failed")
    if summary.get("passed") != summary.get("rewrites"):
        problems.append(f"verification summary: {summary}")
    return problems, summary.get("rewrites", 0), worst


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bnfold", required=True)
    parser.add_argument("--out", type=pathlib.Path)
    parser.add_argument("--rules")
    parser.add_argument("--min-rewrites", type=int, default=1,
                        help="each model must have at least this many rewrites (default 1)")
    parser.add_argument("models", nargs="+")
    args = parser.parse_args()
    out_dir = args.out or pathlib.Path(tempfile.mkdtemp(prefix="bnfold-verify-"))
    out_dir.mkdir(parents=True, exist_ok=True)
    failed = 0
    total = 0
    for model in args.models:
        problems, rewrites, worst = check_model(args.bnfold, model, out_dir, args.rules)
        if rewrites < args.min_rewrites and not problems:
            problems.append(f"only {rewrites} rewrites, expected at least {args.min_rewrites}")
        total += rewrites
        if problems:
            failed += 1
            for problem in problems:
                print(f"FAIL {model}: {problem}")
        else:
            print(f"ok   {model}: {rewrites} rewrites verified, largest relative error {worst:.3g}")
    print(f"{len(args.models)} models, {failed} failed, {total} rewrites verified")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
