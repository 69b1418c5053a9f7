#!/usr/bin/python3
"""Write a MobileNetV2 (1.0, 224) ONNX model with random weights (about 14 MB in float32).

The topology of Sandler et al. 2018 as torchvision exports it: 3x3/2 stem Conv+BN+ReLU6, 17 inverted-residual
blocks (1x1 expand Conv+BN+ReLU6 unless the expansion is 1, 3x3 depthwise Conv (group = channels)+BN+ReLU6,
1x1 linear projection Conv+BN, residual Add when stride 1 and widths match), 1x1 Conv+BN+ReLU6 to 1280,
GlobalAveragePool, Flatten, Gemm 1280->1000. 52 Conv layers, all bias-less and followed by BatchNormalization;
ReLU6 is Clip(x, 0, 6) with the bounds as inputs (opset >= 11).

Usage: scripts/bench/gen_mobilenetv2.py OUT.onnx [--seed S] [--batch N]
"""

import argparse

import numpy as np

from model_builder import GraphBuilder, check_and_save, float_input, make_model, positive_int

# (expansion t, output channels c, repeats n, first stride s), table 2 of the paper.
INVERTED_RESIDUAL_SETTING = [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1),
                             (6, 160, 3, 2), (6, 320, 1, 1)]
STEM_CHANNELS = 32
LAST_CHANNELS = 1280
NUM_CLASSES = 1000
IMAGE_SIZE = 224


def conv_bn(b, x, name, in_channels, out_channels, kernel, stride, group, activation):
    weight = b.he_weight((out_channels, in_channels // group, kernel, kernel), in_channels // group * kernel * kernel)
    pad = kernel // 2
    y = b.node("Conv", [x, b.initializer(f"{name}.conv.weight", weight)], f"{name}.conv_out", f"{name}.conv",
               kernel_shape=[kernel, kernel], strides=[stride, stride], pads=[pad] * 4, group=group)
    # The projection BN scale is small, like zero-init gamma, so residual sums do not grow block after block.
    y = b.batch_norm(y, f"{name}.bn", out_channels, (0.5, 1.5) if activation else (0.1, 0.4))
    return b.relu6(y, f"{name}.relu6") if activation else y


def build(seed, batch):
    b = GraphBuilder(seed)
    conv_count = 0
    x = conv_bn(b, "input", "features.0", 3, STEM_CHANNELS, 3, 2, 1, True)
    conv_count += 1
    channels = STEM_CHANNELS
    block = 1
    for expansion, out_channels, repeats, first_stride in INVERTED_RESIDUAL_SETTING:
        for repeat in range(repeats):
            stride = first_stride if repeat == 0 else 1
            hidden = channels * expansion
            name = f"features.{block}"
            h = x
            if expansion != 1:
                h = conv_bn(b, h, f"{name}.expand", channels, hidden, 1, 1, 1, True)
                conv_count += 1
            h = conv_bn(b, h, f"{name}.depthwise", hidden, hidden, 3, stride, hidden, True)
            h = conv_bn(b, h, f"{name}.project", hidden, out_channels, 1, 1, 1, False)
            conv_count += 2
            if stride == 1 and channels == out_channels:
                h = b.node("Add", [h, x], f"{name}.add_out", f"{name}.add")
            x, channels = h, out_channels
            block += 1
    x = conv_bn(b, x, f"features.{block}", channels, LAST_CHANNELS, 1, 1, 1, True)
    conv_count += 1
    assert conv_count == 52, conv_count

    x = b.node("GlobalAveragePool", [x], "avgpool_out", "avgpool")
    x = b.node("Flatten", [x], "flatten_out", "flatten", axis=1)
    fc_weight = b.rng.standard_normal((NUM_CLASSES, LAST_CHANNELS), dtype=np.float32)
    fc_weight *= np.float32(np.sqrt(1.0 / LAST_CHANNELS))
    b.node("Gemm", [x, b.initializer("classifier.weight", fc_weight),
                    b.initializer("classifier.bias", b.rng.normal(0.0, 0.01, NUM_CLASSES))],
           "logits", "classifier", transB=1)
    return make_model(b, "mobilenetv2", [float_input("input", [batch, 3, IMAGE_SIZE, IMAGE_SIZE])],
                      [float_input("logits", [batch, NUM_CLASSES])],
                      "MobileNetV2 with random weights; every Conv is bias-less and followed by BatchNormalization",
                      "scripts/bench/gen_mobilenetv2.py", seed)


def main():
    parser = argparse.ArgumentParser(description="Write a MobileNetV2 ONNX model with random weights.")
    parser.add_argument("out", metavar="OUT.onnx")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--batch", type=positive_int, default=1)
    args = parser.parse_args()
    check_and_save(build(args.seed, args.batch), args.out, "gen_mobilenetv2")


if __name__ == "__main__":
    main()
