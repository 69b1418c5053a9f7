#!/usr/bin/python3
"""Write a ResNet-50 v1 ONNX model with random weights (about 100 MB in float32).

The topology is the real one (He et al. 2015, v1: the stride sits on the first 1x1 conv of a downsampling
bottleneck): 7x7/2 stem Conv+BN+Relu, 3x3/2 MaxPool, bottleneck stages of [3, 4, 6, 3] blocks with projection
shortcuts, GlobalAveragePool, Flatten, Gemm 2048->1000. All 53 Conv layers have no bias and are followed by a
BatchNormalization, as in exported PyTorch/Caffe models before folding. Weights are random (He init), BN
parameters random but in a trained network's range, so outputs stay finite and folding is checkable numerically.

Uses Debian's python3-onnx (1.12) and python3-numpy, hence /usr/bin/python3.

Usage: scripts/gen_resnet50.py OUT.onnx [--dtype float32|float16] [--batch N] [--seed S] [--opset 13]
                                        [--external-data]
"""

import argparse
import pathlib
import re
import sys

import numpy as np
import onnx
from onnx import helper, numpy_helper

STAGE_BLOCKS = [3, 4, 6, 3]
STAGE_WIDTHS = [64, 128, 256, 512]
BOTTLENECK_EXPANSION = 4
STEM_CHANNELS = 64
NUM_CLASSES = 1000
IMAGE_SIZE = 224
# BatchNormalization's form is stable from opset 9 (no 'spatial'); the installed onnx bounds the top.
MIN_OPSET = 9
IR_VERSION = 8
DTYPES = {"float32": (np.float32, onnx.TensorProto.FLOAT), "float16": (np.float16, onnx.TensorProto.FLOAT16)}


class ResNetBuilder:
    def __init__(self, rng, dtype):
        self.rng = rng
        self.dtype = dtype
        self.nodes = []
        self.initializers = []
        self.conv_count = 0

    def add_initializer(self, name, array):
        self.initializers.append(numpy_helper.from_array(np.ascontiguousarray(array, dtype=self.dtype), name))
        return name

    def conv_bn(self, x, prefix, bn_prefix, in_channels, out_channels, kernel, stride, relu, bn_scale_range):
        """Conv (no bias) -> BatchNormalization [-> Relu]; returns the output name."""
        fan_in = in_channels * kernel * kernel
        # float32 draw then cast: the float16 model holds the same weights, rounded.
        weight = self.rng.standard_normal((out_channels, in_channels, kernel, kernel), dtype=np.float32)
        weight *= np.float32(np.sqrt(2.0 / fan_in))
        pad = kernel // 2
        conv_out = f"{prefix}_out"
        self.nodes.append(helper.make_node(
            "Conv", [x, self.add_initializer(f"{prefix}.weight", weight)], [conv_out], name=prefix,
            kernel_shape=[kernel, kernel], strides=[stride, stride], pads=[pad] * 4))
        self.conv_count += 1

        scale = self.rng.uniform(*bn_scale_range, out_channels)
        bias = self.rng.normal(0.0, 0.1, out_channels)
        mean = self.rng.normal(0.0, 0.1, out_channels)
        # Running variance near the variance He init gives (about 2 for a Relu input of unit variance).
        var = self.rng.uniform(1.0, 3.0, out_channels)
        bn_out = f"{bn_prefix}_out"
        self.nodes.append(helper.make_node(
            "BatchNormalization",
            [conv_out] + [self.add_initializer(f"{bn_prefix}.{field}", value) for field, value in
                          (("weight", scale), ("bias", bias), ("running_mean", mean), ("running_var", var))],
            [bn_out], name=bn_prefix, epsilon=1e-5, momentum=0.9))
        if not relu:
            return bn_out
        relu_out = f"{bn_prefix}_relu_out"
        self.nodes.append(helper.make_node("Relu", [bn_out], [relu_out], name=f"{bn_prefix}_relu"))
        return relu_out

    def bottleneck(self, x, prefix, in_channels, width, stride):
        out_channels = width * BOTTLENECK_EXPANSION
        h = self.conv_bn(x, f"{prefix}.conv1", f"{prefix}.bn1", in_channels, width, 1, stride, True, (0.5, 1.5))
        h = self.conv_bn(h, f"{prefix}.conv2", f"{prefix}.bn2", width, width, 3, 1, True, (0.5, 1.5))
        # A small last-BN scale keeps the residual sum from growing block after block (like zero-init gamma).
        h = self.conv_bn(h, f"{prefix}.conv3", f"{prefix}.bn3", width, out_channels, 1, 1, False, (0.1, 0.4))
        if stride != 1 or in_channels != out_channels:
            shortcut = self.conv_bn(x, f"{prefix}.downsample.0", f"{prefix}.downsample.1", in_channels,
                                    out_channels, 1, stride, False, (0.5, 1.0))
        else:
            shortcut = x
        add_out = f"{prefix}_add_out"
        self.nodes.append(helper.make_node("Add", [h, shortcut], [add_out], name=f"{prefix}.add"))
        out = f"{prefix}_out"
        self.nodes.append(helper.make_node("Relu", [add_out], [out], name=f"{prefix}.relu"))
        return out, out_channels


def build_resnet50(dtype_name, batch, seed, opset):
    numpy_dtype, onnx_dtype = DTYPES[dtype_name]
    b = ResNetBuilder(np.random.default_rng(seed), numpy_dtype)

    h = b.conv_bn("input", "conv1", "bn1", 3, STEM_CHANNELS, 7, 2, True, (0.5, 1.5))
    b.nodes.append(helper.make_node("MaxPool", [h], ["maxpool_out"], name="maxpool",
                                    kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]))
    h, channels = "maxpool_out", STEM_CHANNELS
    for stage_index, (blocks, width) in enumerate(zip(STAGE_BLOCKS, STAGE_WIDTHS)):
        for block_index in range(blocks):
            stride = 2 if block_index == 0 and stage_index > 0 else 1
            h, channels = b.bottleneck(h, f"layer{stage_index + 1}.{block_index}", channels, width, stride)

    b.nodes.append(helper.make_node("GlobalAveragePool", [h], ["avgpool_out"], name="avgpool"))
    b.nodes.append(helper.make_node("Flatten", ["avgpool_out"], ["flatten_out"], name="flatten", axis=1))
    fc_weight = b.rng.standard_normal((NUM_CLASSES, channels), dtype=np.float32) * np.float32(np.sqrt(1.0 / channels))
    fc_bias = b.rng.normal(0.0, 0.01, NUM_CLASSES)
    b.nodes.append(helper.make_node(
        "Gemm", ["flatten_out", b.add_initializer("fc.weight", fc_weight), b.add_initializer("fc.bias", fc_bias)],
        ["logits"], name="fc", transB=1))
    assert b.conv_count == 53, b.conv_count

    graph = helper.make_graph(
        b.nodes, "resnet50_v1",
        [helper.make_tensor_value_info("input", onnx_dtype, [batch, 3, IMAGE_SIZE, IMAGE_SIZE])],
        [helper.make_tensor_value_info("logits", onnx_dtype, [batch, NUM_CLASSES])],
        b.initializers,
        doc_string="ResNet-50 v1 with random weights; every Conv is bias-less and followed by BatchNormalization")
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)],
                              producer_name="bnfold-resnet50-generator", producer_version="1")
    model.ir_version = IR_VERSION
    helper.set_model_props(model, {"generator": "scripts/gen_resnet50.py", "seed": str(seed), "dtype": dtype_name})
    return model


def parse_batch(text):
    """A positive integer, or a symbolic dimension name such as N."""
    if re.fullmatch(r"[1-9][0-9]*", text):
        return int(text)
    if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", text):
        return text
    raise argparse.ArgumentTypeError(f"batch must be a positive integer or a dimension name, got '{text}'")


def main():
    max_opset = onnx.defs.onnx_opset_version()
    parser = argparse.ArgumentParser(description="Write a ResNet-50 v1 ONNX model with random weights.")
    parser.add_argument("out", type=pathlib.Path, metavar="OUT.onnx")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
    parser.add_argument("--batch", type=parse_batch, default=1, help="batch size, or a name for a symbolic one")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--opset", type=int, default=13, help=f"{MIN_OPSET}..{max_opset}")
    parser.add_argument("--external-data", action="store_true",
                        help="store all tensors in OUT.onnx.data next to the model")
    args = parser.parse_args()
    if not MIN_OPSET <= args.opset <= max_opset:
        parser.error(f"--opset {args.opset} is outside {MIN_OPSET}..{max_opset} (the range this onnx can check)")
    if args.seed < 0:
        parser.error("--seed must be non-negative")

    model = build_resnet50(args.dtype, args.batch, args.seed, args.opset)
    onnx.checker.check_model(model, full_check=True)

    out = args.out
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        if args.external_data:
            data_name = out.name + ".data"
            # onnx 1.12 appends to an existing data file: remove it so a rerun does not grow it.
            (out.parent / data_name).unlink(missing_ok=True)
            onnx.save_model(model, str(out), save_as_external_data=True, all_tensors_to_one_file=True,
                            location=data_name, size_threshold=0)
            print(f"{out}  {out.stat().st_size} bytes + {out.parent / data_name}  "
                  f"{(out.parent / data_name).stat().st_size} bytes")
        else:
            out.write_bytes(model.SerializeToString())
            print(f"{out}  {out.stat().st_size} bytes")
    except OSError as error:
        sys.exit(f"gen_resnet50: cannot write {error.filename or out}: {error.strerror}")


if __name__ == "__main__":
    main()
