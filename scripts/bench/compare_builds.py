#!/usr/bin/python3
"""Two bnfold builds side by side: is the new one slower or bigger than the old one?

Runs `bnfold fold MODEL -o OUT` with each binary, taking turns (old, new, old, new, ...) so both see the same machine
conditions, and prints per model the median wall time, the median `rules` phase (`--timings`), and the peak RSS of
each, with new/old ratios. A regression check for changes that must not cost speed (e.g. "within 10%").

Usage: scripts/bench/compare_builds.py --old OLD/bnfold --new NEW/bnfold [--runs 7] [--rules default] MODEL...
"""

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time


def run_once(binary, model, out, rules):
    start = time.perf_counter()
    proc = subprocess.Popen([binary, "fold", model, "-o", out, "--rules", rules, "--timings", "-q"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    stderr = proc.stderr.read()
    proc.stderr.close()
    if os.waitstatus_to_exitcode(status) != 0:
        sys.exit(f"compare_builds: {binary} failed on {model}: {stderr.strip()}")
    match = re.search(r"rules ([0-9.]+) s", stderr)
    return wall, float(match.group(1)) if match else float("nan"), usage.ru_maxrss / 1024.0


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("models", nargs="+")
    parser.add_argument("--old", required=True)
    parser.add_argument("--new", required=True)
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--rules", default="default")
    args = parser.parse_args()
    print(f"{'model':<22} {'old wall s':>10} {'new wall s':>10} {'ratio':>6}   {'old rules s':>11} {'new rules s':>11}"
          f" {'ratio':>6}   {'old RSS MB':>10} {'new RSS MB':>10} {'ratio':>6}")
    with tempfile.TemporaryDirectory() as temp:
        for model in args.models:
            results = {"old": [], "new": []}
            for i in range(args.runs + 1):  # the first round warms the page cache and is dropped
                for which in ("old", "new"):
                    sample = run_once(getattr(args, which), model, os.path.join(temp, f"{which}.onnx"), args.rules)
                    if i > 0:
                        results[which].append(sample)
            med = {w: [statistics.median(r[k] for r in results[w]) for k in range(2)] + [max(r[2] for r in results[w])]
                   for w in results}
            ratio = lambda k: med["new"][k] / med["old"][k] if med["old"][k] else float("nan")
            print(f"{os.path.basename(model):<22} {med['old'][0]:>10.4f} {med['new'][0]:>10.4f} {ratio(0):>6.2f}   "
                  f"{med['old'][1]:>11.4f} {med['new'][1]:>11.4f} {ratio(1):>6.2f}   "
                  f"{med['old'][2]:>10.1f} {med['new'][2]:>10.1f} {ratio(2):>6.2f}")


if __name__ == "__main__":
    main()
