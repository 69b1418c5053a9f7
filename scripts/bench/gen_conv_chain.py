#!/usr/bin/python3
"""Write a long synthetic chain of small residual Conv+BN blocks, for measuring how rule time scales.

    x_{i+1} = Add(Relu(BatchNormalization(Conv3x3(x_i))), x_i)      for i = 0 .. BLOCKS-1

Channels are few (default 8) so tensor bytes stay small and node count dominates: every block is 4 nodes and
5 initializers, every x_i has two consumers (the Conv and the Add), and node and value names are long and
share prefixes, as exported names do. A rule pass that searches consumers or looks names up linearly shows up
as a rule time that grows faster than BLOCKS.

Usage: scripts/bench/gen_conv_chain.py OUT.onnx --blocks N [--channels 8] [--seed S]
"""

import argparse

from model_builder import GraphBuilder, check_and_save, float_input, make_model, positive_int

SPATIAL = 8


def build(blocks, channels, seed):
    b = GraphBuilder(seed)
    x = "input"
    for index in range(blocks):
        name = f"encoder.stages.{index // 100}.blocks.{index % 100}"
        weight = b.he_weight((channels, channels, 3, 3), channels * 9)
        y = b.node("Conv", [x, b.initializer(f"{name}.conv.weight", weight)], f"{name}.conv_out", f"{name}.conv",
                   kernel_shape=[3, 3], pads=[1, 1, 1, 1])
        # Small BN scale keeps the residual sum from growing over thousands of blocks.
        y = b.batch_norm(y, f"{name}.bn", channels, (0.01, 0.05))
        y = b.relu(y, f"{name}.relu")
        x = b.node("Add", [y, x], f"{name}.add_out", f"{name}.add")
    return make_model(b, "conv_chain", [float_input("input", [1, channels, SPATIAL, SPATIAL])],
                      [float_input(x, [1, channels, SPATIAL, SPATIAL])],
                      f"{blocks} residual Conv+BN+Relu blocks of {channels} channels",
                      "scripts/bench/gen_conv_chain.py", seed)


def main():
    parser = argparse.ArgumentParser(description="Write a chain of residual Conv+BN blocks.")
    parser.add_argument("out", metavar="OUT.onnx")
    parser.add_argument("--blocks", type=positive_int, required=True)
    parser.add_argument("--channels", type=positive_int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    # full_check runs shape inference over every node: minutes for 10^4 blocks, and the structure is regular.
    check_and_save(build(args.blocks, args.channels, args.seed), args.out, "gen_conv_chain",
                   full_check=args.blocks <= 1000)


if __name__ == "__main__":
    main()
