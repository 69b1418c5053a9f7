#!/usr/bin/python3
"""A numpy prototype, not in bnfold: chain scales that minimise the estimated int8 noise directly, with the folded
BNs' statistics for the activation powers, against `bnfold fold --equalize` (issue 39's plain-relu half gap).

Per link k (layer k's output channel o divided by s_o, layer k+1's input channel o multiplied by it), the uniform
rounding noise of the two layers is d_k^2 sum_o s_o^2 alpha_o + d_k+1^2 sum_o beta_o / s_o^2, where d is a layer's
int8 step, alpha_o = G_k[o] sum_i c P_k[i] / a_i^2 / 12 and beta_o = P_k+1[o] sum_j c G_k+1[j] b_j^2 / 12 (P: input
channel powers, G: output channel gains to the model's output, a and b: the neighbouring links' scales, c: kernel
size). For fixed steps the optimum is s_o = sqrt(t) (beta_o / alpha_o)^(1/4), clipped so that no channel sets a
larger step; t is searched on a log grid, and the links are swept in turns (coordinate descent). The powers: the
graph input's 1/3 (uniform in [-1, 1)), after each BN + Relu E[relu(N(beta, gamma^2))^2]; the gains propagate back
through the squared weights, each Relu passing the share Phi(beta / |gamma|) (channel_power.py: these powers follow
the measured ones, log-correlation 0.97-1.00, where the data-free estimate's do not).

Only chains of Conv (group 1) -> BatchNormalization -> Relu ending in GlobalAveragePool -> Flatten -> Gemm
(transB 1) are handled: plain-relu. Prints per seed the output SQNR (ONNX Runtime, int8 per-tensor weights) of
folded, `--equalize`, this prototype, and per-channel, and the share of the gap each closes.

Usage: scripts/bench/quant/noise_optimal.py [--model plain-relu] [--seeds 39,7,40,41,42,43,44,1234]
                                            [--bnfold build/apps/bnfold] [--out DIR]
"""

import argparse
import math
import pathlib
import sys
import tempfile

import numpy as np
import onnx
from onnx import numpy_helper

import channel_power
import cle
import nets
import sqnr_bench

ROUNDS = 6
GRID = np.logspace(-12, 12, 600)


class Chain:
    """The folded model's layers in order, with the original model's BN statistics in front of each link."""

    def __init__(self, original, folded):
        statistics = {t.name: numpy_helper.to_array(t).astype(np.float64) for t in original.graph.initializer}
        self.folded = folded
        self.values = {t.name: numpy_helper.to_array(t).astype(np.float64) for t in folded.graph.initializer}
        self.nodes = [n for n in folded.graph.node if n.op_type in ("Conv", "Gemm")]
        ops = [n.op_type for n in folded.graph.node]
        attributes = [{a.name: onnx.helper.get_attribute_value(a) for a in n.attribute} for n in self.nodes]
        if (ops[-3:] != ["GlobalAveragePool", "Flatten", "Gemm"] or ops.count("Gemm") != 1
                or any(a.get("group", 1) != 1 for a in attributes[:-1]) or attributes[-1].get("transB", 0) != 1):
            sys.exit("noise_optimal: only Conv-BN-Relu chains with a GlobalAveragePool -> Flatten -> Gemm head")
        self.weights = [self.values[n.input[1]] if n.op_type == "Conv" else self.values[n.input[1]][:, :, None, None]
                        for n in self.nodes]
        batch_norms = [n for n in original.graph.node if n.op_type == "BatchNormalization"]
        if len(batch_norms) != len(self.nodes) - 1:
            sys.exit("noise_optimal: expected one BN after every layer but the head")
        self.power = [np.full(self.weights[0].shape[1], 1.0 / 3.0)]
        passed = []
        for norm in batch_norms:
            gamma, beta = statistics[norm.input[1]], statistics[norm.input[2]]
            deviation = np.abs(gamma)
            self.power.append(channel_power.relu_mean_square(beta, deviation))
            passed.append(0.5 * (1.0 + np.vectorize(math.erf)(beta / deviation / math.sqrt(2.0))))
        layers = len(self.weights)
        self.gain = [None] * layers
        self.gain[-1] = np.ones(self.weights[-1].shape[0])
        for k in range(layers - 2, -1, -1):
            self.gain[k] = passed[k] * ((self.weights[k + 1] ** 2).sum(axis=(2, 3)).T @ self.gain[k + 1])
        self.kernel = [w.shape[2] * w.shape[3] for w in self.weights]
        self.scales = [np.ones(w.shape[0]) for w in self.weights[:-1]]

    def input_scale(self, k):
        return self.scales[k - 1] if k > 0 else np.ones(self.weights[k].shape[1])

    def output_scale(self, k):
        return self.scales[k] if k < len(self.scales) else np.ones(self.weights[k].shape[0])

    def noise(self, k, a, s):
        """Layer k's uniform rounding noise at the output with input scales a and output scales s."""
        scaled = np.abs(self.weights[k]).max(axis=(2, 3)) * a[None, :] / s[:, None]
        step = scaled.max() / 127.0
        carried = (s[:, None] / a[None, :]) ** 2 * self.power[k][None, :] * self.gain[k][:, None]
        return step * step / 12.0 * self.kernel[k] * float(carried.sum())

    def total_noise(self):
        return sum(self.noise(k, self.input_scale(k), self.output_scale(k)) for k in range(len(self.weights)))

    def optimise_link(self, k):
        a, b = self.input_scale(k), self.output_scale(k + 1)
        alpha = self.gain[k] * self.kernel[k] * float((self.power[k] / a ** 2).sum()) / 12.0
        beta = self.power[k + 1] * self.kernel[k + 1] * float((self.gain[k + 1] * b ** 2).sum()) / 12.0
        first_ranges = (np.abs(self.weights[k]).max(axis=(2, 3)) * a[None, :]).max(axis=1)
        second_ranges = (np.abs(self.weights[k + 1]).max(axis=(2, 3)) / b[:, None]).max(axis=0)
        shape = np.sqrt(np.sqrt(np.maximum(beta, 1e-300) / np.maximum(alpha, 1e-300)))
        best = (self.noise(k, a, self.scales[k]) + self.noise(k + 1, self.scales[k], b), self.scales[k])
        for t in GRID:
            low, high = first_ranges / 127.0, 127.0 * t / second_ranges
            if np.any(low > high):
                continue
            s = np.clip(np.sqrt(t) * shape, low, high)
            value = self.noise(k, a, s) + self.noise(k + 1, s, b)
            if value < best[0]:
                best = (value, s)
        self.scales[k] = best[1]

    def equalized(self):
        for _ in range(ROUNDS):
            for k in range(len(self.scales)):
                self.optimise_link(k)
        values = dict(self.values)
        weights = [w.copy() for w in self.weights]
        for k, s in enumerate(self.scales):
            weights[k] /= s[:, None, None, None]
            if len(self.nodes[k].input) > 2:
                values[self.nodes[k].input[2]] = values[self.nodes[k].input[2]] / s
            weights[k + 1] *= s[None, :, None, None]
        for node, weight in zip(self.nodes, weights):
            values[node.input[1]] = weight if node.op_type == "Conv" else weight[:, :, 0, 0]
        model = onnx.ModelProto()
        model.CopyFrom(self.folded)
        for tensor in model.graph.initializer:
            tensor.CopyFrom(numpy_helper.from_array(values[tensor.name].astype(np.float32), tensor.name))
        return model


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="plain-relu", choices=sorted(nets.GENERATORS))
    parser.add_argument("--seeds", default="39,7,40,41,42,43,44,1234")
    parser.add_argument("--bnfold", default=str(sqnr_bench.REPO / "build" / "apps" / "bnfold"))
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    out = pathlib.Path(args.out or tempfile.mkdtemp(prefix="bnfold-noise-optimal-"))
    out.mkdir(parents=True, exist_ok=True)
    labels = ("folded", "equalize", "noise_optimal", "per_channel")
    print(f"{args.model}: output SQNR (dB), int8 per-tensor weights; gap closed of folded -> per-channel")
    print(f"{'seed':>6} " + " ".join(f"{label:>13}" for label in labels) + "   gap: --equalize / prototype")
    for seed in (int(s) for s in args.seeds.split(",")):
        folder = out / f"seed{seed}"
        folder.mkdir(exist_ok=True)
        original = sqnr_bench.save(nets.GENERATORS[args.model](seed, sqnr_bench.CALIBRATION_BATCH,
                                                              sqnr_bench.IMAGE_SIZE), folder / "original.onnx")
        sqnr_bench.run_bnfold(args.bnfold, original, folder / "folded.onnx", [])
        sqnr_bench.run_bnfold(args.bnfold, original, folder / "equalize.onnx", ["--equalize"])
        folded = onnx.load(str(folder / "folded.onnx"))
        optimal = Chain(onnx.load(original), folded).equalized()
        sqnr_bench.save(optimal, folder / "noise_optimal.onnx")
        candidates = {}
        for label in labels[:3]:
            quantized = cle.quantize_weights(onnx.load(str(folder / f"{label}.onnx")))[0]
            candidates[f"int8:{label}"] = sqnr_bench.save(quantized, folder / f"{label}.int8.onnx")
            candidates[f"float:{label}"] = str(folder / f"{label}.onnx")
        candidates["int8:per_channel"] = sqnr_bench.save(cle.quantize_weights(folded, per_channel=True)[0],
                                                         folder / "per_channel.int8.onnx")
        jobs = {"seeds": list(range(16)), "models": [{"name": args.model, "reference": original,
                                                        "candidates": candidates}]}
        measured = sqnr_bench.run_eval(jobs, folder, "jobs.json", [])[0]["candidates"]
        sqnr = {label: sqnr_bench.worst_output(measured[f"int8:{label}"]["outputs"])[0] for label in labels}
        for label in labels[1:3]:
            drift = sqnr_bench.worst_output(measured[f"float:{label}"]["outputs"])[1]
            if drift > sqnr_bench.EXACT_RELATIVE_TOLERANCE:
                sys.exit(f"noise_optimal: {label} moves the float output by {drift:.2e} of its magnitude")
        gap = sqnr["per_channel"] - sqnr["folded"]
        closed = [(sqnr[label] - sqnr["folded"]) / gap for label in labels[1:3]]
        print(f"{seed:>6} " + " ".join(f"{sqnr[label]:13.2f}" for label in labels) +
              f"   {closed[0]:.0%} / {closed[1]:.0%}")


if __name__ == "__main__":
    main()
