#!/usr/bin/python3
"""Write a graph-heavy model: tens of thousands of small nodes of mixed types and little weight data.

Shaped like what transformer and detection-head exports look like to a graph tool: every block is 14 nodes

    Conv3x3 -> BatchNormalization -> Relu -> Transpose(NHWC) -> Reshape(Constant shape) to tokens
    -> MatMul -> Add(bias) -> Sigmoid -> Mul (SiLU) -> Reshape(Constant shape) to the grid
    -> Transpose(NCHW) -> Add(residual)

with PyTorch-style long dotted names, a Constant node per Reshape shape as PyTorch writes them, and every
block input read twice (the Conv and the residual Add). The default 3,700 blocks give 51,800 nodes in about
6 MB. bnfold folds each BN into its Conv; the rest is for the loader, the rules' matching and the writer.

Usage: scripts/bench/gen_graph_heavy.py OUT.onnx [--blocks 3700] [--channels 4] [--seed S]
"""

import argparse

import numpy as np
from onnx import helper, numpy_helper

from model_builder import GraphBuilder, check_and_save, float_input, make_model, positive_int

SPATIAL = 4
NODES_PER_BLOCK = 14


def constant(builder, values, output, name):
    tensor = numpy_helper.from_array(np.array(values, dtype=np.int64), output)
    builder.nodes.append(helper.make_node("Constant", [], [output], name=name, value=tensor))
    return output


def build(blocks, channels, seed):
    b = GraphBuilder(seed)
    hw = SPATIAL * SPATIAL
    x = "input"
    for index in range(blocks):
        name = f"model.layers.{index // 100}.blocks.{index % 100}"
        weight = b.he_weight((channels, channels, 3, 3), channels * 9)
        y = b.node("Conv", [x, b.initializer(f"{name}.conv.weight", weight)], f"{name}.conv_out", f"{name}.conv",
                   kernel_shape=[3, 3], pads=[1, 1, 1, 1])
        # Small BN scale keeps the residual sum from growing over thousands of blocks.
        y = b.batch_norm(y, f"{name}.bn", channels, (0.01, 0.05))
        y = b.relu(y, f"{name}.relu")
        y = b.node("Transpose", [y], f"{name}.to_nhwc_out", f"{name}.to_nhwc", perm=[0, 2, 3, 1])
        shape = constant(b, [1, hw, channels], f"{name}.tokens.shape", f"{name}.tokens.shape_const")
        y = b.node("Reshape", [y, shape], f"{name}.tokens_out", f"{name}.tokens")
        mix = b.he_weight((channels, channels), channels) * np.float32(0.1)
        y = b.node("MatMul", [y, b.initializer(f"{name}.mix.weight", mix)], f"{name}.mix_out", f"{name}.mix")
        bias = b.rng.normal(0.0, 0.01, channels)
        y = b.node("Add", [y, b.initializer(f"{name}.mix.bias", bias)], f"{name}.mix_bias_out", f"{name}.mix_bias")
        gate = b.node("Sigmoid", [y], f"{name}.act.gate_out", f"{name}.act.gate")
        y = b.node("Mul", [y, gate], f"{name}.act_out", f"{name}.act")
        shape = constant(b, [1, SPATIAL, SPATIAL, channels], f"{name}.grid.shape", f"{name}.grid.shape_const")
        y = b.node("Reshape", [y, shape], f"{name}.grid_out", f"{name}.grid")
        y = b.node("Transpose", [y], f"{name}.to_nchw_out", f"{name}.to_nchw", perm=[0, 3, 1, 2])
        x = b.node("Add", [y, x], f"{name}.residual_out", f"{name}.residual")
    assert len(b.nodes) == blocks * NODES_PER_BLOCK
    return make_model(b, "graph_heavy", [float_input("input", [1, channels, SPATIAL, SPATIAL])],
                      [float_input(x, [1, channels, SPATIAL, SPATIAL])],
                      f"{blocks} mixed blocks of {NODES_PER_BLOCK} nodes, {channels} channels",
                      "scripts/bench/gen_graph_heavy.py", seed)


def main():
    parser = argparse.ArgumentParser(description="Write a graph-heavy model of many small mixed nodes.")
    parser.add_argument("out", metavar="OUT.onnx")
    parser.add_argument("--blocks", type=positive_int, default=3700)
    parser.add_argument("--channels", type=positive_int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    # full_check runs shape inference over every node: slow for thousands of blocks, and the blocks are alike.
    check_and_save(build(args.blocks, args.channels, args.seed), args.out, "gen_graph_heavy",
                   full_check=args.blocks <= 500)


if __name__ == "__main__":
    main()
