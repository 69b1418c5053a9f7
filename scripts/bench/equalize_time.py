#!/usr/bin/python3
"""How much longer `bnfold fold --equalize` takes than a plain `bnfold fold` (issue 39: at most 2x).

Generates ResNet-50 (scripts/gen_resnet50.py) and MobileNetV2 (scripts/bench/gen_mobilenetv2.py) into a folder
(default /tmp/bnfold-equalize-bench; kept between runs), then runs `fold` and `fold --equalize` on each in turns,
so both see the same machine load, and prints per model the median wall and CPU (user + sys) time of each and the
ratios of the medians, with the range of the per-round ratios. On a loaded machine CPU time is the steadier figure.

Usage: scripts/bench/equalize_time.py [--bnfold build/apps/bnfold] [--rounds 5] [--dir /tmp/bnfold-equalize-bench]
"""

import argparse
import os
import pathlib
import statistics
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]
MODELS = {
    "resnet50": ROOT / "scripts" / "gen_resnet50.py",
    "mobilenetv2": ROOT / "scripts" / "bench" / "gen_mobilenetv2.py",
}


def run_once(command):
    """(wall s, user + sys s) of one run of `command`."""
    start = time.perf_counter()
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    stderr = proc.stderr.read().decode()
    proc.stderr.close()
    if os.waitstatus_to_exitcode(status) != 0:
        sys.exit(f"equalize_time: {' '.join(command)} failed: {stderr.strip()}")
    return wall, usage.ru_utime + usage.ru_stime


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bnfold", default=str(ROOT / "build" / "apps" / "bnfold"))
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--dir", type=pathlib.Path, default=pathlib.Path("/tmp/bnfold-equalize-bench"))
    args = parser.parse_args()
    args.dir.mkdir(parents=True, exist_ok=True)
    print(f"{'model':<12} {'fold wall':>9} {'eq wall':>8} {'ratio':>6} {'(range)':>13}   "
          f"{'fold CPU':>8} {'eq CPU':>7} {'ratio':>6} {'(range)':>13}")
    for name, generator in MODELS.items():
        model = args.dir / f"{name}.onnx"
        if not model.exists():
            subprocess.run([sys.executable, str(generator), str(model)], check=True, stdout=subprocess.DEVNULL)
        out = args.dir / f"{name}.out.onnx"
        plain = [args.bnfold, "fold", str(model), "-o", str(out), "-q"]
        runs = {"fold": [], "equalize": []}
        for i in range(args.rounds + 1):  # the first round warms the page cache and is dropped
            for which, command in (("fold", plain), ("equalize", plain + ["--equalize"])):
                sample = run_once(command)
                if i > 0:
                    runs[which].append(sample)
        figures = []
        for k in range(2):  # wall, CPU
            fold = statistics.median(r[k] for r in runs["fold"])
            equalize = statistics.median(r[k] for r in runs["equalize"])
            per_round = [e[k] / f[k] for f, e in zip(runs["fold"], runs["equalize"]) if f[k] > 0]
            span = f"({min(per_round):.1f}-{max(per_round):.1f})" if per_round else "()"
            figures.append(f"{fold:>8.2f}s {equalize:>7.2f}s {equalize / fold if fold else float('nan'):>5.2f}x "
                           f"{span:>13}")
        print(f"{name:<12} {figures[0]}   {figures[1]}")
        out.unlink(missing_ok=True)


if __name__ == "__main__":
    main()
