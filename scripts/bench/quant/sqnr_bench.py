#!/usr/bin/python3
"""Quantization prep benchmark (issue 39 section 4): what folding costs int8 weights, and what equalization buys.

For each generated model (nets.py: trained-like per-channel spread), every constant Conv/ConvTranspose/Gemm/MatMul
weight is fake-quantized to symmetric int8 per tensor (per channel as the reference), and the output SQNR against
the original float model is measured in ONNX Runtime on the same seeded inputs, for the model
  unfolded (BN kept in float);  folded (`bnfold fold`);
  folded + AIMET's CLE (pairs and depthwise triples, one pass) and folded + pairwise CLE swept to convergence,
  both in numpy (cle.py);
  `bnfold fold --equalize` and `... --equalize --absorb-high-bias` (n/a while `bnfold fold --help` has no flag);
  folded with per-channel int8 weights (the reference);
plus the share of the folded model's per-tensor -> per-channel gap (in dB) each method closes, and, once bnfold
has --equalize, issue 39's goals for it. High-bias absorption moves biases, which stay float: it serves activation
quantization. So two more tables fake-quantize every Relu output to uint8 with one step per tensor (range
calibrated as the largest value on the same seeded inputs), with float weights and with per-tensor int8 weights. A model's SQNR is that of its worst output. Every rewrite that claims to
keep the float function (fold, both CLEs, bnfold's equalize) is run in float too: if its outputs move by more
than 1e-4 of the reference's largest magnitude, the script exits 1. High-bias absorption is exact only under an
assumption; its float difference is reported only.

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
# The models are the same in both modes (their BN statistics come from this calibration batch); --quick only
# measures on fewer inputs.
CALIBRATION_BATCH = 16
IMAGE_SIZE = 64
QUICK_SEEDS = 4
FULL_SEEDS = 16

# (label, heading): the rows of the summary, in order.
METHODS = [
    ("unfolded", "unfolded (BN kept in float)"),
    ("folded", "folded (bnfold fold)"),
    ("aimet", "folded + AIMET CLE, one pass"),
    ("sweep", "folded + pairwise CLE, swept"),
    ("equalize", "bnfold fold --equalize"),
    ("equalize_hba", "  ... --absorb-high-bias"),
    ("per_channel", "folded, per-channel int8"),
]
GAP_METHODS = ["aimet", "sweep", "equalize", "equalize_hba"]
# Rows of the activation-quantization tables (the unfolded model's Relu outputs are the folded one's).
ACTIVATION_METHODS = ["folded", "aimet", "sweep", "equalize", "equalize_hba"]
EXACT_METHODS = ["folded", "aimet", "sweep", "equalize"]


def fail(message):
    print(f"sqnr_bench: {message}", file=sys.stderr)
    sys.exit(2)


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help=f"{QUICK_SEEDS} random inputs instead of {FULL_SEEDS}")
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


def prepare_model(name, args, flags):
    """Writes the model and its variants; returns (job for sqnr_eval.js, facts about the rewrites)."""
    folder = pathlib.Path(args.out) / name
    folder.mkdir(parents=True, exist_ok=True)
    model = nets.GENERATORS[name](args.seed, CALIBRATION_BATCH, IMAGE_SIZE)
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
    spread = {"unfolded": cle.worst_range_spread(model)}
    spread.update({label: cle.worst_range_spread(onnx.load(path)) for label, path in floats.items()})
    def batch_norms(graph_model):
        return sum(node.op_type == "BatchNormalization" for node in graph_model.graph.node)

    facts = {"range_spread": spread, "layers_quantized": weights, "bn_nodes": batch_norms(model),
             "bn_nodes_after_fold": batch_norms(folded), "aimet": aimet_facts, "sweep": sweep_facts}
    facts["floats"] = floats
    return {"name": name, "reference": original, "candidates": candidates}, facts


def relu_outputs(model):
    return [node.output[0] for node in model.graph.node if node.op_type == "Relu"]


def with_outputs(model, names):
    """A copy of `model` that also outputs `names` (type float, shape left to the runtime)."""
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    present = {output.name for output in probe.graph.output}
    for name in names:
        if name not in present:
            probe.graph.output.append(onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None))
    return probe


def quantize_activations(model, max_abs):
    """Every Relu output fake-quantized to uint8 per tensor (QuantizeLinear -> DequantizeLinear, zero point 0, step
    max / 255 from the calibration); graph outputs keep reading the float value."""
    quantized = onnx.ModelProto()
    quantized.CopyFrom(model)
    graph = quantized.graph
    nodes = []
    replaced = {}
    for node in graph.node:
        for i, name in enumerate(node.input):
            if name in replaced:
                node.input[i] = replaced[name]
        nodes.append(node)
        if node.op_type != "Relu":
            continue
        name = node.output[0]
        step = max_abs[name] / 255 if max_abs.get(name, 0) > 0 else 1.0
        graph.initializer.append(onnx.helper.make_tensor(f"{name}_act_scale", onnx.TensorProto.FLOAT, [], [step]))
        graph.initializer.append(onnx.helper.make_tensor(f"{name}_act_zero", onnx.TensorProto.UINT8, [], [0]))
        operands = [f"{name}_act_scale", f"{name}_act_zero"]
        nodes.append(onnx.helper.make_node("QuantizeLinear", [name] + operands, [f"{name}_act_q"]))
        nodes.append(onnx.helper.make_node("DequantizeLinear", [f"{name}_act_q"] + operands, [f"{name}_act_dq"]))
        replaced[name] = f"{name}_act_dq"
    del graph.node[:]
    graph.node.extend(nodes)
    return quantized


def add_activation_candidates(jobs, floats_by_model, args, seeds):
    """Calibrates every float variant's Relu outputs on the seeds and adds the uint8-activation candidates
    (`act:` float weights, `w8a8:` per-tensor int8 weights too) to each job."""
    probes = []
    for job in jobs:
        folder = pathlib.Path(args.out) / job["name"]
        for label in ACTIVATION_METHODS:
            if label in floats_by_model[job["name"]]:
                model = onnx.load(floats_by_model[job["name"]][label])
                probe_path = folder / f"{label}.probe.onnx"  # outputs without shapes: the checker wants them
                onnx.save(with_outputs(model, relu_outputs(model)), str(probe_path))
                probes.append({"name": f"{job['name']}/{label}", "path": str(probe_path)})
    calibration = run_eval({"seeds": seeds, "models": probes}, args.out, "calibration.json", ["--calibrate"])
    ranges = {entry["name"]: entry["max_abs"] for entry in calibration}
    for job in jobs:
        folder = pathlib.Path(args.out) / job["name"]
        for label in ACTIVATION_METHODS:
            key = f"{job['name']}/{label}"
            if key not in ranges:
                continue
            activations = quantize_activations(onnx.load(floats_by_model[job["name"]][label]), ranges[key])
            job["candidates"][f"act:{label}"] = save(activations, folder / f"{label}.a8.onnx")
            job["candidates"][f"w8a8:{label}"] = save(cle.quantize_weights(activations)[0], folder / f"{label}.w8a8.onnx")


def run_eval(jobs, out, file_name, extra):
    jobs_path = pathlib.Path(out) / file_name
    jobs_path.write_text(json.dumps(jobs))
    result = subprocess.run(["node", str(pathlib.Path(__file__).with_name("sqnr_eval.js"))] + extra + [str(jobs_path)],
                            capture_output=True, text=True, check=False)
    if result.returncode != 0:
        fail(f"sqnr_eval.js failed: {result.stderr.strip()}")
    return json.loads(result.stdout)["models"]


def evaluate(jobs, out):
    return run_eval(jobs, out, "jobs.json", [])


def summarize(measured, facts):
    rows = []
    for model in measured:
        candidates = model["candidates"]
        row = {"model": model["name"], "sqnr_db": {}, "float_relative_diff": {}, "gap_closed": {},
               **facts[model["name"]]}
        row["act_sqnr_db"], row["w8a8_sqnr_db"] = {}, {}
        for label in ACTIVATION_METHODS:
            for prefix in ("act", "w8a8"):
                if f"{prefix}:{label}" in candidates:
                    row[f"{prefix}_sqnr_db"][label] = worst_output(candidates[f"{prefix}:{label}"]["outputs"])[0]
        for label, _ in METHODS:
            if f"int8:{label}" in candidates:
                row["sqnr_db"][label] = worst_output(candidates[f"int8:{label}"]["outputs"])[0]
            if f"float:{label}" in candidates:
                row["float_relative_diff"][label] = worst_output(candidates[f"float:{label}"]["outputs"])[1]
        folded, per_channel = row["sqnr_db"]["folded"], row["sqnr_db"]["per_channel"]
        for label in GAP_METHODS:
            if label in row["sqnr_db"] and per_channel > folded:
                row["gap_closed"][label] = (row["sqnr_db"][label] - folded) / (per_channel - folded)
        row["goals"] = equalize_goals(row)
        rows.append(row)
    return rows


def equalize_goals(row):
    """Issue 39's "Done when" for `fold --equalize` on this model: None per goal when it does not apply."""
    sqnr = row["sqnr_db"]
    if "equalize" not in sqnr:
        return {}
    margin = 0.005  # dB: the printed precision; closer than this is a tie
    return {
        "not_below_folded": sqnr["equalize"] >= sqnr["folded"] - margin,
        "at_least_aimet": sqnr["equalize"] >= sqnr["aimet"] - margin,
        "at_least_sweep": sqnr["equalize"] >= sqnr["sweep"] - margin,
        "half_the_gap": row["gap_closed"].get("equalize", 0) >= 0.5 if row["model"] in nets.ALL_RELU else None,
    }


def finite_or_null(value):
    """JSON has no infinity (an SQNR with no noise at all): null instead."""
    if isinstance(value, dict):
        return {k: finite_or_null(v) for k, v in value.items()}
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def cell(value, fmt):
    return "n/a" if value is None else fmt.format(value)


def print_table(title, rows, labels, field, fmt, note=None):
    headings = dict(METHODS)
    label_width = max(len(headings[k]) for k in labels) + 2
    widths = [max(len(r["model"]), 9) + 2 for r in rows]
    print(title)
    print("method".ljust(label_width) + "".join(r["model"].rjust(w) for r, w in zip(rows, widths)))
    for label in labels:
        print(headings[label].ljust(label_width)
              + "".join(cell(r[field].get(label), fmt).rjust(w) for r, w in zip(rows, widths)))
    if note:
        print(note(label_width, widths))
    print()


def print_tables(rows):
    print_table("Output SQNR (dB), int8 weights per tensor unless noted (worst output; reference: the float model)",
                rows, [k for k, _ in METHODS], "sqnr_db", "{:.2f}")
    print_table("Output SQNR (dB), float weights, Relu outputs uint8 per tensor (calibrated max on the inputs)",
                rows, ACTIVATION_METHODS, "act_sqnr_db", "{:.2f}")
    print_table("Output SQNR (dB), int8 weights per tensor and Relu outputs uint8 per tensor", rows,
                ACTIVATION_METHODS, "w8a8_sqnr_db", "{:.2f}")
    print_table("Worst layer's weight range spread: largest / median output-channel range", rows,
                [k for k, _ in METHODS if k != "per_channel"], "range_spread", "{:.0f}")
    print_table("Share of the folded model's per-tensor -> per-channel SQNR gap closed", rows, GAP_METHODS,
                "gap_closed", "{:.0%}")

    def cle_sets(label_width, widths):
        sets = "".join(f"{r['aimet']['pairs']}p+{r['aimet']['triples']}t".rjust(w) for r, w in zip(rows, widths))
        sweeps = "".join(f"{r['sweep']['sweeps']}x{r['sweep']['links']}".rjust(w) for r, w in zip(rows, widths))
        return ("AIMET pairs+triples".ljust(label_width) + sets + "\n"
                + "sweeps x links".ljust(label_width) + sweeps)

    print_table("Float outputs: max |difference to the original| / max |original output|", rows,
                EXACT_METHODS + ["equalize_hba"], "float_relative_diff", "{:.1e}", cle_sets)
    if any(r["goals"] for r in rows):
        goals = [("not_below_folded", "not below folded"), ("at_least_aimet", "at least AIMET CLE"),
                 ("at_least_sweep", "at least the CLE sweep"),
                 ("half_the_gap", f"half the gap ({', '.join(nets.ALL_RELU)})")]
        label_width = max(len(text) for _, text in goals) + 2
        widths = [max(len(r["model"]), 9) + 2 for r in rows]
        print("Issue 39 goals for bnfold fold --equalize (per-tensor int8 SQNR)")
        print("goal".ljust(label_width) + "".join(r["model"].rjust(w) for r, w in zip(rows, widths)))
        for key, text in goals:
            verdicts = [{True: "yes", False: "NO", None: "-"}[r["goals"].get(key)] for r in rows]
            print(text.ljust(label_width) + "".join(v.rjust(w) for v, w in zip(verdicts, widths)))
        print()


def main():
    args = parse_args()
    started = time.monotonic()
    seeds = list(range(QUICK_SEEDS if args.quick else FULL_SEEDS))
    flags = bnfold_flags(args.bnfold)
    jobs, facts = [], {}
    for name in args.models:
        job, facts[name] = prepare_model(name, args, flags)
        jobs.append(job)
    for name, model_facts in facts.items():
        if model_facts["bn_nodes_after_fold"]:
            print(f"sqnr_bench: warning: bnfold left {model_facts['bn_nodes_after_fold']} BatchNormalization in "
                  f"{name}: its 'folded' figures are not of a fully folded model", file=sys.stderr)
    add_activation_candidates(jobs, {name: model_facts.pop("floats") for name, model_facts in facts.items()},
                              args, seeds)
    rows = summarize(evaluate({"seeds": seeds, "models": jobs}, args.out), facts)
    print_tables(rows)
    print(f"{len(rows)} models, {len(seeds)} inputs 1x3x{IMAGE_SIZE}x{IMAGE_SIZE} uniform in [-1, 1) (seeds 0.."
          f"{seeds[-1]}); bnfold --equalize: {'yes' if flags['equalize'] else 'n/a'}, "
          f"--absorb-high-bias: {'yes' if flags['absorb_high_bias'] else 'n/a'}; "
          f"{time.monotonic() - started:.0f} s")
    if args.json:
        with open(args.json, "w") as out:
            summary = {"seeds": len(seeds), "image_size": IMAGE_SIZE, "bnfold_flags": flags, "models": rows}
            json.dump(finite_or_null(summary), out, indent=1)
    violations = [f"{r['model']} {label} ({r['float_relative_diff'][label]:.1e})" for r in rows
                  for label in EXACT_METHODS
                  if r["float_relative_diff"].get(label, 0) > EXACT_RELATIVE_TOLERANCE]
    if violations:
        print(f"sqnr_bench: float function changed beyond {EXACT_RELATIVE_TOLERANCE:g}: {', '.join(violations)}",
              file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
