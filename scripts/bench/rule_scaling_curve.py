#!/usr/bin/python3
"""The rules phase per block of the residual Conv+BN chain at several sizes: where its time per block grows.

The benchmark's scaling target compares two sizes, N and 10N blocks. This prints the whole curve, so that a step (a
working set outgrowing a cache) and a steady growth (work that grows faster than the graph) look different. It
runs `bnfold_rule_phase` (the default rules, timed alone after loading) on chains made by gen_conv_chain.py, the
sizes taking turns, once with the caches as loading left them and once with them emptied first.

Usage: scripts/bench/rule_scaling_curve.py --build-dir build-bench [--blocks 500,1000,...] [--rounds 9]
       [--out-dir bench-out/scaling]
"""

import argparse
import pathlib
import re
import statistics
import subprocess
import sys

SCRIPTS = pathlib.Path(__file__).resolve().parent


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--build-dir", type=pathlib.Path, required=True)
    parser.add_argument("--blocks", default="500,1000,2000,5000,10000,20000")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--out-dir", type=pathlib.Path, default=pathlib.Path("bench-out/scaling"))
    args = parser.parse_args()
    tool = args.build_dir / "apps/bnfold_rule_phase"
    if not tool.exists():
        sys.exit(f"rule_scaling_curve: {tool} not found (build the bnfold_rule_phase target)")
    sizes = [int(b) for b in args.blocks.split(",")]
    args.out_dir.mkdir(parents=True, exist_ok=True)
    paths = {}
    for blocks in sizes:
        paths[blocks] = args.out_dir / f"chain-{blocks}.onnx"
        if not paths[blocks].exists():
            print(f"generating {paths[blocks]}", file=sys.stderr)
            subprocess.run([sys.executable, SCRIPTS / "gen_conv_chain.py", paths[blocks], "--blocks", str(blocks)],
                           check=True, stdout=subprocess.DEVNULL)
    modes = {"cached": [], "emptied": ["--empty-caches"]}
    times = {(blocks, mode): [] for blocks in sizes for mode in modes}
    faults = {}
    for _ in range(args.rounds):
        for blocks in sizes:
            for mode, extra in modes.items():
                run = subprocess.run([tool, paths[blocks]] + extra, capture_output=True, text=True)
                match = re.search(r"rules ([0-9.]+) s, ([0-9]+) page faults", run.stdout)
                if run.returncode != 0 or not match:
                    sys.exit(f"rule_scaling_curve: {tool} {paths[blocks]} failed: {run.stderr.strip()[:300]}")
                times[(blocks, mode)].append(float(match.group(1)))
                faults[blocks] = int(match.group(2))
    print(f"rules phase per block, median of {args.rounds} rounds (the sizes in turns)")
    print(f"{'blocks':>7} {'page faults':>11} {'cached ms':>10} {'us/block':>9} {'emptied ms':>11} {'us/block':>9}")
    for blocks in sizes:
        cached = statistics.median(times[(blocks, "cached")])
        emptied = statistics.median(times[(blocks, "emptied")])
        print(f"{blocks:>7} {faults[blocks]:>11} {cached * 1e3:>10.2f} {cached / blocks * 1e6:>9.2f} "
              f"{emptied * 1e3:>11.2f} {emptied / blocks * 1e6:>9.2f}")


if __name__ == "__main__":
    main()
