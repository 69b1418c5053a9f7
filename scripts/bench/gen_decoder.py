#!/usr/bin/python3
"""Write a ConvTranspose+BN image decoder (a DCGAN generator, Radford et al. 2015) with random weights.

    z [N, 100, 1, 1] -> ConvTranspose 4x4/1 -> BN -> Relu                  (4x4,   8*F channels)
                     -> 3 x (ConvTranspose 4x4/2 pad 1 -> BN -> Relu)       (32x32, F channels)
                     -> ConvTranspose 4x4/2 pad 1 -> Tanh                   (64x64, 3 channels)

F = --features (default 128: about 50 MB in float32). The ConvTranspose layers have no bias, as in the
reference implementation; the weight layout is [in, out, k, k], so BN folds into axis 1 of the weight.

Usage: scripts/bench/gen_decoder.py OUT.onnx [--features 128] [--seed S] [--batch N]
"""

import argparse

from model_builder import GraphBuilder, check_and_save, float_input, make_model, positive_int

LATENT = 100
IMAGE_CHANNELS = 3


def conv_transpose(b, x, name, in_channels, out_channels, stride, pad):
    # fan-in of a transposed conv output pixel: in_channels * k*k / stride^2 taps on average.
    weight = b.he_weight((in_channels, out_channels, 4, 4), max(1, in_channels * 16 // (stride * stride)))
    return b.node("ConvTranspose", [x, b.initializer(f"{name}.weight", weight)], f"{name}_out", name,
                  kernel_shape=[4, 4], strides=[stride, stride], pads=[pad] * 4)


def build(features, seed, batch):
    b = GraphBuilder(seed)
    widths = [LATENT, features * 8, features * 4, features * 2, features]
    x = "z"
    for index in range(len(widths) - 1):
        first = index == 0
        name = f"main.{index}"
        x = conv_transpose(b, x, f"{name}.deconv", widths[index], widths[index + 1], 1 if first else 2, 0 if first else 1)
        x = b.batch_norm(x, f"{name}.bn", widths[index + 1])
        x = b.relu(x, f"{name}.relu")
    x = conv_transpose(b, x, "main.out.deconv", features, IMAGE_CHANNELS, 2, 1)
    b.node("Tanh", [x], "image", "main.out.tanh")
    return make_model(b, "dcgan_decoder", [float_input("z", [batch, LATENT, 1, 1])],
                      [float_input("image", [batch, IMAGE_CHANNELS, 64, 64])],
                      "DCGAN generator with random weights; ConvTranspose layers followed by BatchNormalization",
                      "scripts/bench/gen_decoder.py", seed)


def main():
    parser = argparse.ArgumentParser(description="Write a ConvTranspose+BN decoder with random weights.")
    parser.add_argument("out", metavar="OUT.onnx")
    parser.add_argument("--features", type=positive_int, default=128)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--batch", type=positive_int, default=1)
    args = parser.parse_args()
    check_and_save(build(args.features, args.seed, args.batch), args.out, "gen_decoder")


if __name__ == "__main__":
    main()
