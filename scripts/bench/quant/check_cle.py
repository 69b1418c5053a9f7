#!/usr/bin/python3
"""Checks of the benchmark's own CLE (cle.py) on the kinds of link the benchmark's models do not contain.

The benchmark's models have Relu links between ungrouped and depthwise Convs only; cle.py also equalizes
through PRelu (per-channel slope) and LeakyRelu, into grouped Convs, and between Gemms. Here one small model
has all of them; the checks: which links are found (and which are not: fan-out, HardSwish, a shared weight, an
intermediate graph output), AIMET's CLS sets, equal ranges on every link after the sweep, and the float function
unchanged in ONNX Runtime (scripts/bench/quant/sqnr_eval.js). Exit 0 when all hold, 1 otherwise; about 2 s.

Usage: scripts/bench/quant/check_cle.py [--out DIR]
"""

import argparse
import json
import pathlib
import subprocess
import sys
import tempfile

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

import cle

FLOAT_TOLERANCE = 1e-5  # of the reference output's largest magnitude
RANGE_TOLERANCE = 1e-3  # relative, after the sweep (which stops when no scale moves by 1e-4)


def random_weight(rng, shape):
    """Rows (output channels of a Conv, input features of a transB=0 Gemm) over two decades of norm."""
    spread = 10.0 ** rng.uniform(-1.0, 1.0, (shape[0],) + (1,) * (len(shape) - 1))
    return (rng.standard_normal(shape) * spread).astype(np.float32)


def conv(inputs, output, group=1, kernel=3):
    return helper.make_node("Conv", inputs, [output], pads=[kernel // 2] * 4, group=group)


def linkable_model(rng):
    """c1 -PRelu-> c2 (group 2) -LeakyRelu-> c3 -Relu-> c4 (depthwise) -Relu-> c5 -> GAP -> Gemm h1 -Relu-> Gemm y."""
    weights = {
        "w1": random_weight(rng, (8, 3, 3, 3)), "b1": random_weight(rng, (8,)),
        "slope": rng.uniform(0.0, 0.3, (8, 1, 1)).astype(np.float32),
        "w2": random_weight(rng, (8, 4, 3, 3)), "b2": random_weight(rng, (8,)),
        "w3": random_weight(rng, (6, 8, 1, 1)), "w4": random_weight(rng, (6, 1, 3, 3)),
        "w5": random_weight(rng, (5, 6, 1, 1)),
        "g1": random_weight(rng, (16, 5)), "gb1": random_weight(rng, (16,)),
        "g2": random_weight(rng, (16, 4)), "gb2": random_weight(rng, (4,)),
    }
    nodes = [
        conv(["x", "w1", "b1"], "c1"), helper.make_node("PRelu", ["c1", "slope"], ["a1"]),
        conv(["a1", "w2", "b2"], "c2", group=2), helper.make_node("LeakyRelu", ["c2"], ["a2"], alpha=0.1),
        conv(["a2", "w3"], "c3", kernel=1), helper.make_node("Relu", ["c3"], ["a3"]),
        conv(["a3", "w4"], "c4", group=6), helper.make_node("Relu", ["c4"], ["a4"]),
        conv(["a4", "w5"], "c5", kernel=1),
        helper.make_node("GlobalAveragePool", ["c5"], ["p"]), helper.make_node("Flatten", ["p"], ["f"]),
        helper.make_node("Gemm", ["f", "g1", "gb1"], ["h1"], transB=1), helper.make_node("Relu", ["h1"], ["r"]),
        helper.make_node("Gemm", ["r", "g2", "gb2"], ["y"]),
    ]
    return make_model(nodes, weights, [2, 3, 8, 8], {"y": [2, 4]})


def blocked_model(rng):
    """Links that must not be equalized, each for one reason: d1 read by two Convs; d2 -HardSwish-> d3; d4 and d5
    sharing a weight (d3 -Relu-> d4 and d4 -Relu-> d5); d6's Relu output also a graph output."""
    weights = {name: random_weight(rng, (4, 4, 3, 3)) for name in ("v2", "v3", "v4", "shared", "v6", "v7")}
    weights["v1"] = random_weight(rng, (4, 3, 3, 3))
    nodes = [
        conv(["x", "v1"], "d1"), conv(["d1", "v2"], "d2a"), conv(["d1", "v3"], "d2"),
        helper.make_node("HardSwish", ["d2"], ["s2"]), conv(["s2", "v4"], "d3"),
        helper.make_node("Relu", ["d3"], ["r3"]), conv(["r3", "shared"], "d4"),
        helper.make_node("Relu", ["d4"], ["r4"]), conv(["r4", "shared"], "d5"),
        helper.make_node("Relu", ["d5"], ["r5"]), conv(["r5", "v6"], "d6"),
        helper.make_node("Relu", ["d6"], ["r6"]), conv(["r6", "v7"], "d7"),
        helper.make_node("Add", ["d7", "d2a"], ["z"]),
    ]
    return make_model(nodes, weights, [1, 3, 6, 6], {"z": [1, 4, 6, 6], "r6": [1, 4, 6, 6]}, opset=14)


def make_model(nodes, weights, input_shape, outputs, opset=13):
    graph = helper.make_graph(
        nodes, "cle_check", [helper.make_tensor_value_info("x", TensorProto.FLOAT, input_shape)],
        [helper.make_tensor_value_info(name, TensorProto.FLOAT, shape) for name, shape in outputs.items()],
        [numpy_helper.from_array(value, name) for name, value in weights.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def names(layers):
    return [layer.node.output[0] for layer in layers]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", help="folder for the models (default: a temporary one)")
    args = parser.parse_args()
    out = pathlib.Path(args.out or tempfile.mkdtemp(prefix="bnfold-cle-check-"))
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(7)
    failures = []

    def expect(condition, what):
        print(("ok    " if condition else "FAIL  ") + what)
        if not condition:
            failures.append(what)

    model = linkable_model(rng)
    chains = [names(chain) for chain in cle.WeightGraph(model).chains()]
    expect(chains == [["c1", "c2", "c3", "c4", "c5"], ["h1", "y"]],
           f"links through PRelu, LeakyRelu, Relu, into grouped and depthwise Convs, Gemm to Gemm: {chains}")
    sets = [names(s) for chain in cle.WeightGraph(model).chains() for s in cle._aimet_sets(chain)]
    expect(sets == [["c3", "c4", "c5"]], f"AIMET's sets skip the grouped Conv and the Gemms: {sets}")
    blocked = [names(chain) for chain in cle.WeightGraph(blocked_model(rng)).chains()]
    expect(blocked == [], f"no link across fan-out, HardSwish, a shared weight, a graph output: {blocked}")

    aimet, _ = cle.equalize_aimet(model)
    sweep, facts = cle.equalize_sweep(model)
    expect(facts["converged"], f"the sweep converges ({facts['sweeps']} sweeps)")
    for chain in cle.WeightGraph(sweep).chains():
        for first, second in zip(chain, chain[1:]):
            r1, r2 = first.output_channel_ranges(), second.input_channel_ranges()
            mismatch = float(np.max(np.abs(r1 - r2) / np.maximum(r1, 1e-30)))
            expect(mismatch < RANGE_TOLERANCE,
                   f"after the sweep {first.node.output[0]} -> {second.node.output[0]} ranges equal ({mismatch:.1e})")

    paths = {}
    for label, variant in (("original", model), ("aimet", aimet), ("sweep", sweep)):
        paths[label] = str(out / f"{label}.onnx")
        onnx.save(variant, paths[label])
    jobs = out / "jobs.json"
    jobs.write_text(json.dumps({"seeds": [0, 1], "models": [{
        "name": "cle_check", "reference": paths["original"],
        "candidates": {"aimet": paths["aimet"], "sweep": paths["sweep"]}}]}))
    result = subprocess.run(["node", str(pathlib.Path(__file__).with_name("sqnr_eval.js")), str(jobs)],
                            capture_output=True, text=True, check=False)
    if result.returncode != 0:
        print(f"check_cle: {result.stderr.strip()}", file=sys.stderr)
        sys.exit(2)
    for label, measured in json.loads(result.stdout)["models"][0]["candidates"].items():
        for output in measured["outputs"]:
            relative = output["max_abs"] / output["reference_max_abs"]
            expect(relative < FLOAT_TOLERANCE, f"{label} keeps the float output {output['name']} ({relative:.1e})")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
