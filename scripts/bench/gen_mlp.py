#!/usr/bin/python3
"""Write an MLP whose hidden layers are Gemm+BN+Relu or MatMul+BN+Relu (default about 100 MB in float32).

    input [N, W] -> LAYERS x (Gemm(transB=1, bias) | MatMul) -> BatchNormalization -> Relu -> Gemm W->1000

--layer gemm: Gemm with transB=1 and a bias, as PyTorch exports nn.Linear followed by nn.BatchNorm1d.
--layer matmul: MatMul with a [in, out] weight and no bias, as TensorFlow/Keras Dense(use_bias=False) + BN export.
BatchNormalization on a 2-D [N, C] input normalises axis 1, the layer's output column.

Usage: scripts/bench/gen_mlp.py OUT.onnx --layer gemm|matmul [--width 2048] [--layers 6] [--seed S] [--batch N]
"""

import argparse

import numpy as np

from model_builder import GraphBuilder, check_and_save, float_input, make_model, positive_int

NUM_CLASSES = 1000


def build(layer_kind, width, layers, seed, batch):
    b = GraphBuilder(seed)
    x = "input"
    for index in range(layers):
        name = f"layers.{index}"
        if layer_kind == "gemm":
            weight = b.he_weight((width, width), width)  # [out, in]: transB=1
            bias = b.rng.normal(0.0, 0.01, width)
            y = b.node("Gemm", [x, b.initializer(f"{name}.linear.weight", weight),
                                b.initializer(f"{name}.linear.bias", bias)],
                       f"{name}.linear_out", f"{name}.linear", transB=1)
        else:
            weight = b.he_weight((width, width), width)  # [in, out]
            y = b.node("MatMul", [x, b.initializer(f"{name}.dense.kernel", weight)], f"{name}.dense_out",
                       f"{name}.dense")
        y = b.batch_norm(y, f"{name}.bn", width)
        x = b.relu(y, f"{name}.relu")
    head = b.rng.standard_normal((NUM_CLASSES, width), dtype=np.float32) * np.float32(np.sqrt(1.0 / width))
    b.node("Gemm", [x, b.initializer("head.weight", head), b.initializer("head.bias", b.rng.normal(0, 0.01, NUM_CLASSES))],
           "logits", "head", transB=1)
    return make_model(b, f"mlp_{layer_kind}", [float_input("input", [batch, width])],
                      [float_input("logits", [batch, NUM_CLASSES])],
                      f"{layers} x ({'Gemm' if layer_kind == 'gemm' else 'MatMul'} + BatchNormalization + Relu), "
                      f"width {width}, random weights", "scripts/bench/gen_mlp.py", seed)


def main():
    parser = argparse.ArgumentParser(description="Write a Gemm+BN or MatMul+BN MLP with random weights.")
    parser.add_argument("out", metavar="OUT.onnx")
    parser.add_argument("--layer", choices=["gemm", "matmul"], required=True)
    parser.add_argument("--width", type=positive_int, default=2048)
    parser.add_argument("--layers", type=positive_int, default=6)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--batch", type=positive_int, default=1)
    args = parser.parse_args()
    check_and_save(build(args.layer, args.width, args.layers, args.seed, args.batch), args.out, "gen_mlp")


if __name__ == "__main__":
    main()
