#!/usr/bin/python3
"""sqnr_bench.py over several generator seeds: how robust `fold --equalize` is, and whether a change to it helps.

One seed's models decide its goals by fractions of a dB that move either way from one seed to the next (the rounding
errors of a model's layers add up differently), so a change to equalization is judged over several seeds. For each
seed this runs sqnr_bench.py (--seed S --json) and prints the --equalize SQNR against folded / AIMET / the sweep and
the goals it meets; then, per model, how often each goal is met and the mean margins. With --baseline, the same
models are also run with a second bnfold and the differences printed (the models, and so every other method's
figures, are the same for both).

Usage: scripts/bench/quant/sqnr_seeds.py [--bnfold build/apps/bnfold] [--baseline OTHER_BNFOLD]
                                         [--seeds 39,7,40,41,42,43,44,1234] [--quick] [--jobs 2] [--out DIR]
Needs what sqnr_bench.py needs; about 10 s per seed and binary on two cores.
"""

import argparse
import concurrent.futures
import json
import pathlib
import statistics
import subprocess
import sys
import tempfile

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parents[2]
GOALS = [("not_below_folded", "not below folded"), ("at_least_aimet", "at least AIMET"),
         ("at_least_sweep", "at least the sweep"), ("half_the_gap", "half the gap")]


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bnfold", default=str(REPO / "build" / "apps" / "bnfold"))
    parser.add_argument("--baseline", help="a second bnfold to compare --equalize with, on the same models")
    parser.add_argument("--seeds", default="39,7,40,41,42,43,44,1234", help="generator seeds, comma-separated")
    parser.add_argument("--quick", action="store_true", help="sqnr_bench.py --quick (fewer inputs)")
    parser.add_argument("--jobs", type=int, default=2, help="sqnr_bench.py runs at once")
    parser.add_argument("--out", help="folder for the models and JSON (default: a temporary one, removed)")
    args = parser.parse_args()
    try:
        args.seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    except ValueError:
        parser.error(f"--seeds: not a comma-separated list of integers: {args.seeds}")
    if not args.seeds:
        parser.error("--seeds: no seed given")
    return args


def run_bench(bnfold, seed, out, quick):
    """sqnr_bench.py's JSON rows for one binary and seed, by model name."""
    json_path = out / f"seed-{seed}.json"
    command = [sys.executable, str(HERE / "sqnr_bench.py"), "--bnfold", bnfold, "--seed", str(seed),
               "--out", str(out / f"models-{seed}"), "--json", str(json_path)]
    if quick:
        command.append("--quick")
    done = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if done.returncode != 0:
        sys.exit(f"sqnr_seeds: seed {seed}, {bnfold}: sqnr_bench.py failed:\n{done.stdout[-2000:]}")
    return {row["model"]: row for row in json.loads(json_path.read_text())["models"]}


def run_all(binaries, args, out):
    """results[binary label][seed][model] = sqnr_bench.py's row."""
    results = {label: {} for label in binaries}
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        futures = {}
        for label, path in binaries.items():
            for seed in args.seeds:
                folder = out / label
                folder.mkdir(parents=True, exist_ok=True)
                futures[pool.submit(run_bench, path, seed, folder, args.quick)] = (label, seed)
        for future in concurrent.futures.as_completed(futures):
            label, seed = futures[future]
            results[label][seed] = future.result()
    return results


def print_seeds(rows_by_seed, seeds, models):
    print("--equalize output SQNR (dB), with (folded / AIMET / sweep), per seed; then goals met")
    for seed in seeds:
        cells, met, counted = [], 0, 0
        for model in models:
            sqnr = rows_by_seed[seed][model]["sqnr_db"]
            cells.append(f"{model} {sqnr['equalize']:.2f} ({sqnr['folded']:.2f} / {sqnr['aimet']:.2f} / "
                         f"{sqnr['sweep']:.2f})")
            for verdict in rows_by_seed[seed][model]["goals"].values():
                if verdict is not None:
                    counted += 1
                    met += bool(verdict)
        print(f"seed {seed}: " + "; ".join(cells) + f"; goals {met} of {counted}")


def print_summary(rows_by_seed, seeds, models):
    print()
    print(f"Per model over {len(seeds)} seeds: goals met, and --equalize minus folded / AIMET / sweep (dB, mean)")
    header = f"{'':22}" + "".join(f"{m:>14}" for m in models)
    print(header)
    for key, text in GOALS:
        cells = []
        for model in models:
            verdicts = [rows_by_seed[s][model]["goals"].get(key) for s in seeds]
            verdicts = [v for v in verdicts if v is not None]
            cells.append(f"{sum(verdicts)}/{len(verdicts)}" if verdicts else "-")
        print(f"{text:22}" + "".join(f"{c:>14}" for c in cells))
    for method in ("folded", "aimet", "sweep"):
        margins = [statistics.mean(rows_by_seed[s][m]["sqnr_db"]["equalize"] - rows_by_seed[s][m]["sqnr_db"][method]
                                   for s in seeds) for m in models]
        print(f"{'minus ' + method:22}" + "".join(f"{x:>+14.2f}" for x in margins))
    gaps = [statistics.median(rows_by_seed[s][m]["gap_closed"].get("equalize", float("nan")) for s in seeds)
            for m in models]
    print(f"{'gap closed (median)':22}" + "".join(f"{g:>14.0%}" for g in gaps))
    total = sum(1 for s in seeds for m in models for v in rows_by_seed[s][m]["goals"].values() if v)
    counted = sum(1 for s in seeds for m in models for v in rows_by_seed[s][m]["goals"].values() if v is not None)
    print(f"goals met in all: {total} of {counted}")


def print_comparison(new, old, seeds, models):
    print()
    print("--bnfold minus --baseline, --equalize output SQNR (dB): mean, and seeds better / worse by > 0.05 dB")
    print(f"{'':22}" + "".join(f"{m:>14}" for m in models))
    means, counts = [], []
    for model in models:
        differences = [new[s][model]["sqnr_db"]["equalize"] - old[s][model]["sqnr_db"]["equalize"] for s in seeds]
        means.append(f"{statistics.mean(differences):+.2f}")
        counts.append(f"{sum(d > 0.05 for d in differences)} / {sum(d < -0.05 for d in differences)}")
    print(f"{'mean':22}" + "".join(f"{c:>14}" for c in means))
    print(f"{'better / worse':22}" + "".join(f"{c:>14}" for c in counts))


def main():
    args = parse_args()
    binaries = {"new": args.bnfold}
    if args.baseline:
        binaries["baseline"] = args.baseline
    for path in binaries.values():
        if not pathlib.Path(path).is_file():
            sys.exit(f"sqnr_seeds: {path}: no such bnfold executable")
    with tempfile.TemporaryDirectory(prefix="bnfold-sqnr-seeds-") as temporary:
        out = pathlib.Path(args.out) if args.out else pathlib.Path(temporary)
        results = run_all(binaries, args, out)
    new = results["new"]
    models = list(new[args.seeds[0]])
    print_seeds(new, args.seeds, models)
    print_summary(new, args.seeds, models)
    if args.baseline:
        print_comparison(new, results["baseline"], args.seeds, models)


if __name__ == "__main__":
    main()
