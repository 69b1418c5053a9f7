#!/usr/bin/python3
"""Quantization prep benchmark (issue 39 section 4): what folding costs int8 weights, and what equalization buys.

For each generated model (nets.py: trained-like per-channel spread), every constant Conv/ConvTranspose/Gemm/MatMul
weight is fake-quantized to symmetric int8 per tensor (per channel as the reference), and the output SQNR against
the original float model is measured in ONNX Runtime on the same seeded inputs, for:
  unfolded        BN kept in float, layer weights quantized
  folded          `bnfold fold`
  aimet-cle       folded + AIMET's CLE (pairs and depthwise triples, one pass; cle.py, numpy)
  cle-sweep       folded + pairwise CLE swept to convergence (cle.py, numpy)
  bnfold-eq       `bnfold fold --equalize`                        (n/a while bnfold has no such flag)
  bnfold-eq+hba   `bnfold fold --equalize --absorb-high-bias`     (n/a likewise)
  per-channel     folded, int8 per output channel
plus the fraction of the per-tensor -> per-channel gap (in dB, folded model) each method closes. A model's SQNR is
that of its worst output. Every rewrite that claims to keep the float function (fold, both CLEs, bnfold's
equalize) is run in float too: if its outputs move by more than 1e-4 of the reference's largest magnitude, the
script exits 1. High-bias absorption is exact only under an assumption; its float difference is reported only.

Usage: scripts/bench/quant/sqnr_bench.py [--quick] [--models mobilenet,resnet,...] [--json FILE]
                                         [--bnfold PATH] [--out DIR] [--seed S]
Needs /usr/bin/python3 with python3-onnx and python3-numpy, node, and onnxruntime-node (scripts/ort/ensure_ort.sh).
"""

import argparse
import json
import math
import os
import pathlib
import subprocess
import sys
import time

import onnx

import cle
import nets

REPO = pathlib.Path(__file__).resolve().parents[3]
EXACT_RELATIVE_TOLERANCE = 1e-4

# (label, heading): the rows of the summary, in order.
METHODS = [
    ("unfolded", "unfolded"),
    ("folded", "folded"),
    ("aimet", "aimet-cle"),
    ("sweep", "cle-sweep"),
    ("equalize", "bnfold-eq"),
    ("equalize_hba", "bnfold-eq+hba"),
    ("per_channel", "per-channel"),
]
GAP_METHODS = ["aimet", "sweep", "equalize", "equalize_hba"]
EXACT_METHODS = ["folded", "aimet", "sweep", "equalize"]


def fail(message):
    print(f"sqnr_bench: {message}", file=sys.stderr)
    sys.exit(2)


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="smaller inputs and fewer seeds (well under 3 minutes)")
    parser.add_argument("--models", default=",".join(nets.GENERATORS),
                        help=f"comma-separated subset of {','.join(nets.GENERATORS)}")
    parser.add_argument("--json", help="also write the results as JSON here")
    parser.add_argument("--bnfold", default=str(REPO / "build" / "apps" / "bnfold"), help="the bnfold executable")
    parser.add_argument("--out", default=str(REPO / "bench-out" / "sqnr"), help="folder for the generated models")
    parser.add_argument("--seed", type=int, default=39, help="seed of the model generators (inputs: seeds 0..K-1)")
    args = parser.parse_args()
    args.models = [m for m in args.models.split(",") if m]
    unknown = [m for m in args.models if m not in nets.GENERATORS]
    if unknown or not args.models:
        fail(f"unknown model(s) {','.join(unknown) or '(none)'}; choose from {','.join(nets.GENERATORS)}")
    if not os.access(args.bnfold, os.X_OK):
        fail(f"{args.bnfold}: not an executable bnfold (build it, or pass --bnfold)")
    return args


def bnfold_flags(bnfold):
    help_text = subprocess.run([bnfold, "fold", "--help"], capture_output=True, text=True, check=False).stdout
    return {"equalize": "--equalize" in help_text, "absorb_high_bias": "--absorb-high-bias" in help_text}


def run_bnfold(bnfold, source, target, extra):
    command = [bnfold, "fold", str(source), "-o", str(target), "-q"] + extra
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        fail(f"{' '.join(command)} failed ({result.returncode}): {result.stderr.strip().splitlines()[-1:]}")


def save(model, path):
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return str(path)


def sqnr_db(signal, noise):
    if noise == 0:
        return math.inf
    return -math.inf if signal == 0 else 10 * math.log10(signal / noise)


def worst_output(outputs):
    """SQNR of the worst output and the largest float difference relative to that output's magnitude."""
    sqnr = min(sqnr_db(o["signal"], o["noise"]) for o in outputs)
    relative = max((math.inf if o["max_abs"] is None else o["max_abs"]) / max(o["reference_max_abs"], 1e-30)
                   for o in outputs)
    return sqnr, relative


def prepare_model(name, args, flags, sizes):
    """Writes the model and its variants; returns (job for sqnr_eval.js, facts about the rewrites)."""
    folder = pathlib.Path(args.out) / name
    folder.mkdir(parents=True, exist_ok=True)
    model = nets.GENERATORS[name](args.seed, sizes["calibration_batch"], sizes["batch"], sizes["size"])
    original = save(model, folder / "original.onnx")
    folded_path = folder / "folded.onnx"
    run_bnfold(args.bnfold, original, folded_path, [])
    folded = onnx.load(str(folded_path))
    floats = {"folded": str(folded_path)}
    aimet, aimet_facts = cle.equalize_aimet(folded)
    floats["aimet"] = save(aimet, folder / "aimet.onnx")
    sweep, sweep_facts = cle.equalize_sweep(folded)
    floats["sweep"] = save(sweep, folder / "sweep.onnx")
    if flags["equalize"]:
        floats["equalize"] = str(folder / "equalize.onnx")
        run_bnfold(args.bnfold, original, floats["equalize"], ["--equalize"])
        if flags["absorb_high_bias"]:
            floats["equalize_hba"] = str(folder / "equalize_hba.onnx")
            run_bnfold(args.bnfold, original, floats["equalize_hba"], ["--equalize", "--absorb-high-bias"])
    candidates = {f"float:{label}": path for label, path in floats.items()}
    quantized_unfolded, weights = cle.quantize_weights(model)
    candidates["int8:unfolded"] = save(quantized_unfolded, folder / "unfolded.int8.onnx")
    for label, path in floats.items():
        candidates[f"int8:{label}"] = save(cle.quantize_weights(onnx.load(path))[0], folder / f"{label}.int8.onnx")
    candidates["int8:per_channel"] = save(cle.quantize_weights(folded, per_channel=True)[0],
                                          folder / "folded.int8-per-channel.onnx")
    facts = {"layers_quantized": weights, "bn_nodes": sum(n.op_type == "BatchNormalization" for n in model.graph.node),
             "bn_nodes_after_fold": sum(n.op_type == "BatchNormalization" for n in folded.graph.node),
             "aimet": aimet_facts, "sweep": sweep_facts}
    return {"name": name, "reference": original, "candidates": candidates}, facts


def evaluate(jobs, out):
    jobs_path = pathlib.Path(out) / "jobs.json"
    jobs_path.write_text(json.dumps(jobs))
    env = dict(os.environ)
    result = subprocess.run(["node", str(pathlib.Path(__file__).with_name("sqnr_eval.js")), str(jobs_path)],
                            capture_output=True, text=True, env=env, check=False)
    if result.returncode != 0:
        fail(f"sqnr_eval.js failed: {result.stderr.strip()}")
    return json.loads(result.stdout)["models"]


def summarize(measured, facts):
    rows = []
    for model in measured:
        candidates = model["candidates"]
        row = {"model": model["name"], "sqnr_db": {}, "float_relative_diff": {}, "gap_closed": {},
               **facts[model["name"]]}
        for label, _ in METHODS:
            if f"int8:{label}" in candidates:
                row["sqnr_db"][label] = worst_output(candidates[f"int8:{label}"]["outputs"])[0]
            if f"float:{label}" in candidates:
                row["float_relative_diff"][label] = worst_output(candidates[f"float:{label}"]["outputs"])[1]
        folded, per_channel = row["sqnr_db"]["folded"], row["sqnr_db"]["per_channel"]
        for label in GAP_METHODS:
            if label in row["sqnr_db"] and per_channel > folded:
                row["gap_closed"][label] = (row["sqnr_db"][label] - folded) / (per_channel - folded)
        rows.append(row)
    return rows


def finite_or_null(value):
    """JSON has no infinity (an SQNR with no noise at all): null instead."""
    if isinstance(value, dict):
        return {k: finite_or_null(v) for k, v in value.items()}
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def cell(value, fmt):
    return "n/a" if value is None else fmt.format(value)


def print_tables(rows):
    width = max(len(r["model"]) for r in rows) + 2
    print("Output SQNR (dB) with int8 weights, per tensor unless noted; reference: the float model")
    print("model".ljust(width) + "".join(h.rjust(15) for _, h in METHODS))
    for r in rows:
        print(r["model"].ljust(width) + "".join(cell(r["sqnr_db"].get(k), "{:.2f}").rjust(15) for k, _ in METHODS))
    headings = dict(METHODS)
    print("\nShare of the per-tensor -> per-channel gap of the folded model closed")
    print("model".ljust(width) + "".join(headings[k].rjust(15) for k in GAP_METHODS))
    for r in rows:
        print(r["model"].ljust(width) + "".join(cell(r["gap_closed"].get(k), "{:.0%}").rjust(15) for k in GAP_METHODS))
    float_methods = EXACT_METHODS + ["equalize_hba"]
    print("\nFloat outputs: max |difference| to the original / max |original output|")
    print("model".ljust(width) + "".join(headings[k].rjust(15) for k in float_methods) + "   aimet sets, sweeps")
    for r in rows:
        sets = f"{r['aimet']['pairs']}p+{r['aimet']['triples']}t, {r['sweep']['sweeps']} over {r['sweep']['links']}"
        print(r["model"].ljust(width)
              + "".join(cell(r["float_relative_diff"].get(k), "{:.1e}").rjust(15) for k in float_methods)
              + "   " + sets)


def main():
    args = parse_args()
    started = time.monotonic()
    sizes = ({"calibration_batch": 8, "batch": 2, "size": 32, "seeds": 2} if args.quick
             else {"calibration_batch": 16, "batch": 4, "size": 64, "seeds": 4})
    flags = bnfold_flags(args.bnfold)
    jobs, facts = [], {}
    for name in args.models:
        job, facts[name] = prepare_model(name, args, flags, sizes)
        jobs.append(job)
    rows = summarize(evaluate({"seeds": list(range(sizes["seeds"])), "models": jobs}, args.out), facts)
    print_tables(rows)
    print(f"\n{len(rows)} models, inputs {sizes['batch']}x3x{sizes['size']}x{sizes['size']} uniform in [-1, 1), "
          f"seeds 0..{sizes['seeds'] - 1}; bnfold --equalize: {'yes' if flags['equalize'] else 'n/a'}, "
          f"--absorb-high-bias: {'yes' if flags['absorb_high_bias'] else 'n/a'}; "
          f"{time.monotonic() - started:.0f} s")
    if args.json:
        with open(args.json, "w") as out:
            json.dump(finite_or_null({"sizes": sizes, "bnfold_flags": flags, "models": rows}), out, indent=1)
    violations = [f"{r['model']} {label} ({r['float_relative_diff'][label]:.1e})" for r in rows
                  for label in EXACT_METHODS
                  if r["float_relative_diff"].get(label, 0) > EXACT_RELATIVE_TOLERANCE]
    if violations:
        print(f"sqnr_bench: float function changed beyond {EXACT_RELATIVE_TOLERANCE:g}: {', '.join(violations)}",
              file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
