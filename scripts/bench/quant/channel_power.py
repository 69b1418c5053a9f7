#!/usr/bin/python3
"""How well two data-free estimates predict each input channel's activation power (mean square) at each Conv.

`--equalize` weighs each weight's int8 rounding noise by the power of the input channel it multiplies. Its estimate
propagates a unit input power through the squared weights (ignoring biases and activations); the folded BNs'
statistics give another: a BN's output channel is about N(beta, gamma^2), so after a Relu its mean square is
E[relu(x)^2] = (beta^2 + gamma^2) Phi(beta / gamma) + beta gamma phi(beta / gamma). This script runs a benchmark
model (nets.py) in numpy on seeded inputs as the benchmark draws them, and prints per Conv the log-correlation of
each estimate with the measured power over the input channels (channels that are never active left out), and the
range of measured / estimated.

Only Conv -> BatchNormalization -> Relu chains are modelled; the walk stops at the first other op (for
plain-relu: at the head).

Usage: scripts/bench/quant/channel_power.py [--model plain-relu] [--seed 39] [--inputs 8]
"""

import argparse
import math

import numpy as np
from onnx import helper, numpy_helper

import nets

IMAGE_SIZE = 64  # as sqnr_bench.py
CALIBRATION_BATCH = 16


def conv2d(x, weight, bias, stride, pad):
    n, channels, height, width = x.shape
    _, _, kh, kw = weight.shape
    padded = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    out_h, out_w = (height + 2 * pad - kh) // stride + 1, (width + 2 * pad - kw) // stride + 1
    columns = np.empty((n, channels, kh, kw, out_h, out_w))
    for i in range(kh):
        for j in range(kw):
            columns[:, :, i, j] = padded[:, :, i:i + stride * out_h:stride, j:j + stride * out_w:stride]
    y = np.einsum("ncijhw,ocij->nohw", columns, weight)
    return y if bias is None else y + bias[None, :, None, None]


def relu_mean_square(mean, std):
    z = mean / std
    below = 0.5 * (1.0 + np.vectorize(math.erf)(z / math.sqrt(2.0)))
    density = np.exp(-z * z / 2.0) / math.sqrt(2.0 * math.pi)
    return (mean * mean + std * std) * below + mean * std * density


def log_correlation(measured, estimate):
    return float(np.corrcoef(np.log(measured), np.log(estimate))[0, 1])


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="plain-relu", choices=sorted(nets.GENERATORS))
    parser.add_argument("--seed", type=int, default=39)
    parser.add_argument("--inputs", type=int, default=8)
    args = parser.parse_args()
    model = nets.GENERATORS[args.model](args.seed, CALIBRATION_BATCH, IMAGE_SIZE)
    weights = {t.name: numpy_helper.to_array(t).astype(np.float64) for t in model.graph.initializer}
    shape = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    shape[0] = args.inputs
    x = np.random.default_rng(0).uniform(-1.0, 1.0, size=shape)
    data_free = np.ones(shape[1])  # the unit input power, as the estimate starts
    bn_statistics = None  # from the BN before the last Relu
    print(f"{args.model} (seed {args.seed}), {args.inputs} inputs 1x{shape[1]}x{shape[2]}x{shape[3]} uniform in [-1, 1)")
    print(f"{'conv':<10} {'data-free':>9} {'BN stats':>9}   {'measured / BN-stats estimate: median (range)':<46} dead")
    for node in model.graph.node:
        attributes = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        if node.op_type == "Conv" and attributes.get("group", 1) == 1:
            weight = weights[node.input[1]]
            if bn_statistics is not None:
                measured = (x * x).mean(axis=(0, 2, 3))
                alive = measured > 0
                ratio = measured[alive] / bn_statistics[alive]
                spread = f"{np.median(ratio):.3g} ({ratio.min():.3g} to {ratio.max():.3g})"
                print(f"{node.name:<10} {log_correlation(measured[alive], data_free[alive]):9.2f} "
                      f"{log_correlation(measured[alive], bn_statistics[alive]):9.2f}   {spread:<46} {np.sum(~alive)}")
            bias = weights[node.input[2]] if len(node.input) > 2 else None
            pad = attributes.get("pads", [0, 0, 0, 0])[0]
            x = conv2d(x, weight, bias, attributes.get("strides", [1, 1])[0], pad)
            folded_rows = (weight * weight).sum(axis=(2, 3))  # times the BN's gamma^2 / var below
            data_free = folded_rows @ data_free
        elif node.op_type == "BatchNormalization":
            gamma, beta, mean, var = (weights[name] for name in node.input[1:5])
            epsilon = attributes.get("epsilon", 1e-5)
            factor = gamma / np.sqrt(var + epsilon)
            x = (x - mean[None, :, None, None]) * factor[None, :, None, None] + beta[None, :, None, None]
            data_free = data_free * factor * factor
            bn_statistics = relu_mean_square(beta, np.abs(gamma))
        elif node.op_type == "Relu":
            x = np.maximum(x, 0.0)
        else:
            break


if __name__ == "__main__":
    main()
