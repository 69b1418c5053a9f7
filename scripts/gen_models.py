#!/usr/bin/python3
"""Write bnfold's small sample models (models/*.onnx).

Each model is deterministic (fixed seeds, byte-identical across runs), passes
onnx.checker.check_model(full_check=True), and shows one situation the folding
rules must handle, or must refuse. models/README.md says which is which.

Uses Debian's python3-onnx (1.12) and python3-numpy, hence /usr/bin/python3.

Usage: scripts/gen_models.py [--out DIR]     (default: the repository's models/)
"""

import argparse
import pathlib
import sys
import zlib

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

GENERATOR = "scripts/gen_models.py"
BASE_SEED = 20240611
# Pinned so the bytes do not change with the onnx package's default.
IR_VERSION = 8
FLOAT = TensorProto.FLOAT


class GraphBuilder:
    """Collects nodes and initializers for one graph, with a seeded RNG for weights."""

    def __init__(self, model_name):
        # Seed per model (not one global stream) so adding or changing a model never changes the others.
        self.rng = np.random.default_rng([BASE_SEED, zlib.crc32(model_name.encode())])
        self.nodes = []
        self.initializers = []

    def constant(self, name, array):
        self.initializers.append(numpy_helper.from_array(np.ascontiguousarray(array, dtype=np.float32), name))
        return name

    def he_weight(self, name, shape, fan_in):
        # He init keeps activations at a sane scale through the Relus.
        return self.constant(name, self.rng.standard_normal(shape) * np.sqrt(2.0 / fan_in))

    def small_values(self, name, shape, scale=0.1):
        return self.constant(name, self.rng.standard_normal(shape) * scale)

    def batch_norm_params(self, prefix, channels):
        """scale, B, mean, var as a trained network would have them: nothing is 0 or 1, a few scales negative."""
        sign = self.rng.choice([-1.0, 1.0], size=channels, p=[0.2, 0.8])
        scale = self.rng.uniform(0.5, 1.5, channels) * sign
        bias = self.rng.normal(0.0, 0.5, channels)
        mean = self.rng.normal(0.0, 0.5, channels)
        var = self.rng.uniform(0.5, 2.0, channels)
        return [
            self.constant(f"{prefix}.weight", scale),
            self.constant(f"{prefix}.bias", bias),
            self.constant(f"{prefix}.running_mean", mean),
            self.constant(f"{prefix}.running_var", var),
        ]

    def node(self, op_type, inputs, outputs, name, doc, **attributes):
        self.nodes.append(helper.make_node(op_type, inputs, outputs, name=name, doc_string=doc, **attributes))
        return outputs[0]

    def build(self, *, model_name, opset, doc, shows, inputs, outputs):
        graph = helper.make_graph(self.nodes, model_name, inputs, outputs, self.initializers, doc_string=doc)
        model = helper.make_model(
            graph,
            opset_imports=[helper.make_opsetid("", opset)],
            producer_name="bnfold-sample-generator",
            producer_version="1",
            doc_string=doc,
        )
        model.ir_version = IR_VERSION
        model.model_version = 1
        helper.set_model_props(model, {"bnfold.sample": model_name, "bnfold.shows": shows, "generator": GENERATOR})
        return model


def float_input(name, shape):
    return helper.make_tensor_value_info(name, FLOAT, shape)


def resnet_block():
    name = "resnet_block"
    b = GraphBuilder(name)
    stem_channels, classes = 16, 10

    x = "input"
    stem = b.node("Conv", [x, b.he_weight("stem.conv.weight", [stem_channels, 3, 3, 3], 3 * 9)], ["stem_conv_out"],
                  "stem/conv", "3x3 stem convolution without bias; the BN that follows supplies the shift",
                  kernel_shape=[3, 3], pads=[1, 1, 1, 1])
    stem = b.node("BatchNormalization", [stem, *b.batch_norm_params("stem.bn", stem_channels)], ["stem_bn_out"],
                  "stem/bn", "inference-mode BN directly after a bias-less Conv: foldable", epsilon=1e-5)
    block_in = b.node("Relu", [stem], ["stem_relu_out"], "stem/relu", "block input; also the residual shortcut")

    h = b.node("Conv", [block_in, b.he_weight("block1.conv1.weight", [stem_channels, stem_channels, 3, 3],
                                              stem_channels * 9)],
               ["block1_conv1_out"], "block1/conv1", "first 3x3 conv of the basic block",
               kernel_shape=[3, 3], pads=[1, 1, 1, 1])
    h = b.node("BatchNormalization", [h, *b.batch_norm_params("block1.bn1", stem_channels)], ["block1_bn1_out"],
               "block1/bn1", "foldable into block1/conv1")
    h = b.node("Relu", [h], ["block1_relu1_out"], "block1/relu1", "")
    h = b.node("Conv", [h, b.he_weight("block1.conv2.weight", [stem_channels, stem_channels, 3, 3],
                                       stem_channels * 9)],
               ["block1_conv2_out"], "block1/conv2", "second 3x3 conv of the basic block",
               kernel_shape=[3, 3], pads=[1, 1, 1, 1])
    h = b.node("BatchNormalization", [h, *b.batch_norm_params("block1.bn2", stem_channels)], ["block1_bn2_out"],
               "block1/bn2", "foldable into block1/conv2; its output feeds the residual Add",
               epsilon=1e-3)
    h = b.node("Add", [h, block_in], ["block1_add_out"], "block1/residual_add",
               "identity shortcut: adds a computed tensor, not a constant, so it is not a bias")
    h = b.node("Relu", [h], ["block1_out"], "block1/relu_out", "")

    h = b.node("GlobalAveragePool", [h], ["pool_out"], "head/pool", "")
    h = b.node("Flatten", [h], ["flatten_out"], "head/flatten", "", axis=1)
    b.node("Gemm", [h, b.he_weight("head.fc.weight", [classes, stem_channels], stem_channels),
                    b.small_values("head.fc.bias", [classes])],
           ["logits"], "head/fc", "classifier, weight stored [out, in] as PyTorch does", transB=1)

    return b.build(
        model_name=name, opset=13,
        doc="ResNet basic block: stem Conv+BN+Relu, residual block of two Conv+BN, shortcut Add, classifier head.",
        shows="three Conv->BN pairs to fold (Conv without bias), one feeding a residual Add",
        inputs=[float_input("input", ["N", 3, 32, 32])],
        outputs=[helper.make_tensor_value_info("logits", FLOAT, ["N", classes])],
    )


def mlp_bn1d():
    name = "mlp_bn1d"
    b = GraphBuilder(name)
    in_features, hidden, out_features = 32, 64, 16

    h = b.node("Gemm", ["features", b.he_weight("fc1.weight", [hidden, in_features], in_features),
                        b.small_values("fc1.bias", [hidden])],
               ["fc1_out"], "fc1/gemm", "Linear layer as exported by PyTorch: weight [out, in] with transB=1",
               transB=1)
    h = b.node("BatchNormalization", [h, *b.batch_norm_params("fc1.bn", hidden)], ["fc1_bn_out"], "fc1/bn",
               "BatchNorm1d on a 2-D [N, C] input: channel is axis 1, i.e. the Gemm output column", epsilon=1e-5)
    h = b.node("Relu", [h], ["fc1_relu_out"], "fc1/relu", "")
    h = b.node("MatMul", [h, b.he_weight("fc2.weight", [hidden, out_features], hidden)], ["fc2_out"], "fc2/matmul",
               "bias-less Linear as a MatMul with a constant [K, N] weight")
    b.node("BatchNormalization", [h, *b.batch_norm_params("fc2.bn", out_features)], ["embedding"], "fc2/bn",
           "foldable into the MatMul weight columns plus a new bias", epsilon=1e-3)

    return b.build(
        model_name=name, opset=15,
        doc="Two-layer MLP with BatchNorm1d after each linear layer.",
        shows="BN folded into Gemm (transB=1) and into MatMul with a constant weight, on 2-D activations",
        inputs=[float_input("features", ["N", in_features])],
        outputs=[helper.make_tensor_value_info("embedding", FLOAT, ["N", out_features])],
    )


def decoder_convtranspose():
    name = "decoder_convtranspose"
    b = GraphBuilder(name)
    in_channels, mid_channels, out_channels, groups = 8, 12, 4, 2

    # ConvTranspose weight is [C_in, C_out / group, kH, kW]: the output channel is on axis 1, per group.
    h = b.node("ConvTranspose", ["latent",
                                 b.he_weight("up1.deconv.weight", [in_channels, mid_channels // groups, 4, 4],
                                             in_channels // groups * 16),
                                 b.small_values("up1.deconv.bias", [mid_channels])],
               ["up1_deconv_out"], "up1/deconv", "2x upsampling grouped transposed conv with bias",
               group=groups, kernel_shape=[4, 4], strides=[2, 2], pads=[1, 1, 1, 1])
    h = b.node("BatchNormalization", [h, *b.batch_norm_params("up1.bn", mid_channels)], ["up1_bn_out"], "up1/bn",
               "foldable into the grouped ConvTranspose: output channel g*M/group+j lives in weight[.., j, ..]")
    h = b.node("Relu", [h], ["up1_relu_out"], "up1/relu", "")
    h = b.node("ConvTranspose", [h, b.he_weight("up2.deconv.weight", [mid_channels, out_channels, 3, 3],
                                                mid_channels * 9)],
               ["up2_deconv_out"], "up2/deconv", "3x3 transposed conv without bias, same spatial size",
               kernel_shape=[3, 3], pads=[1, 1, 1, 1])
    b.node("BatchNormalization", [h, *b.batch_norm_params("up2.bn", out_channels)], ["image"], "up2/bn",
           "foldable; the fold must create the ConvTranspose bias", epsilon=1e-3)

    return b.build(
        model_name=name, opset=13,
        doc="Small decoder: grouped ConvTranspose+BN+Relu, then ConvTranspose+BN.",
        shows="BN folded into ConvTranspose: grouped with bias, and ungrouped without bias",
        inputs=[float_input("latent", ["N", in_channels, 8, 8])],
        outputs=[helper.make_tensor_value_info("image", FLOAT, ["N", out_channels, 16, 16])],
    )


def training_bn():
    name = "training_bn"
    b = GraphBuilder(name)
    in_channels, channels = 3, 8

    h = b.node("Conv", ["input", b.he_weight("conv.weight", [channels, in_channels, 3, 3], in_channels * 9),
                        b.small_values("conv.bias", [channels])],
               ["conv_out"], "conv", "3x3 conv with bias", kernel_shape=[3, 3], pads=[1, 1, 1, 1])
    b.node("BatchNormalization", [h, *b.batch_norm_params("bn", channels)], ["output", "running_mean", "running_var"],
           "bn", "training-mode BN: normalizes with the batch statistics and updates the running ones",
           training_mode=1, momentum=0.9, epsilon=1e-5)

    return b.build(
        model_name=name, opset=15,
        doc="Conv followed by a training-mode BatchNormalization whose three outputs are all graph outputs.",
        shows="training-mode BN is not foldable; it can be expanded into ReduceMean/Sub/Mul/... ops",
        inputs=[float_input("input", ["N", in_channels, 16, 16])],
        outputs=[
            helper.make_tensor_value_info("output", FLOAT, ["N", channels, 16, 16]),
            helper.make_tensor_value_info("running_mean", FLOAT, [channels]),
            helper.make_tensor_value_info("running_var", FLOAT, [channels]),
        ],
    )


def bias_add():
    name = "bias_add"
    b = GraphBuilder(name)
    # channels == width on purpose: a [channels] constant then has the "right" length but broadcasts over W.
    in_channels, channels, size = 4, 8, 8

    h = b.node("Conv", ["input", b.he_weight("branch_a.conv.weight", [channels, in_channels, 3, 3], in_channels * 9)],
               ["branch_a_conv_out"], "branch_a/conv", "conv without bias; the Add below is its bias",
               kernel_shape=[3, 3], pads=[1, 1, 1, 1])
    h = b.node("Add", [h, b.small_values("branch_a.bias", [1, channels, 1, 1])], ["branch_a_add_out"],
               "branch_a/add_bias", "per-channel [1,C,1,1] constant: absorbable into the Conv bias")
    h = b.node("Mul", [h, b.constant("branch_a.scale", b.rng.uniform(0.5, 1.5, [channels, 1, 1]))],
               ["branch_a_mul_out"], "branch_a/mul_scale", "per-channel [C,1,1] scale: absorbable into weight and bias")
    b.node("Relu", [h], ["branch_a_out"], "branch_a/relu", "")

    h = b.node("Conv", ["input", b.he_weight("branch_b.conv.weight", [channels, in_channels, 3, 3], in_channels * 9)],
               ["branch_b_conv_out"], "branch_b/conv", "conv without bias, output [N, 8, 8, 8]",
               kernel_shape=[3, 3], pads=[1, 1, 1, 1])
    b.node("Add", [h, b.small_values("branch_b.row_offset", [size])], ["branch_b_out"], "branch_b/add_last_axis",
           "[8] constant on an NCHW tensor broadcasts over the LAST axis (W), not C: must not become a Conv bias")

    return b.build(
        model_name=name, opset=13,
        doc="Two bias-less convolutions: one followed by per-channel Add and Mul, one by a last-axis Add.",
        shows="Add/Mul absorbed into Conv bias/weight when per-channel; refused for a [C]-length last-axis constant",
        inputs=[float_input("input", ["N", in_channels, size, size])],
        outputs=[
            helper.make_tensor_value_info("branch_a_out", FLOAT, ["N", channels, size, size]),
            helper.make_tensor_value_info("branch_b_out", FLOAT, ["N", channels, size, size]),
        ],
    )


def unfoldable_bn():
    name = "unfoldable_bn"
    b = GraphBuilder(name)
    channels, size = 4, 8

    b.node("BatchNormalization", ["input", *b.batch_norm_params("input_bn", channels)], ["input_bn_out"],
           "input_bn", "BN on a graph input: there is no producing layer to fold into")

    h = b.node("Conv", ["input", b.he_weight("post_act.conv.weight", [channels, channels, 3, 3], channels * 9),
                        b.small_values("post_act.conv.bias", [channels])],
               ["post_act_conv_out"], "post_act/conv", "", kernel_shape=[3, 3], pads=[1, 1, 1, 1])
    h = b.node("Relu", [h], ["post_act_relu_out"], "post_act/relu", "the non-linearity between Conv and BN")
    b.node("BatchNormalization", [h, *b.batch_norm_params("post_act.bn", channels)], ["post_act_bn_out"],
           "post_act/bn", "BN after Relu: Relu is in the way, the Conv weights cannot absorb it")

    h = b.node("Conv", ["input", b.he_weight("shared.conv.weight", [channels, channels, 1, 1], channels),
                        b.small_values("shared.conv.bias", [channels])],
               ["shared_conv_out"], "shared/conv", "1x1 conv read by two nodes", kernel_shape=[1, 1])
    b.node("BatchNormalization", [h, *b.batch_norm_params("shared.bn", channels)], ["shared_bn_out"], "shared/bn",
           "folding would change what shared/sigmoid sees, since the Conv output has another reader")
    b.node("Sigmoid", [h], ["shared_sigmoid_out"], "shared/sigmoid", "second reader of shared/conv")

    outputs = ["input_bn_out", "post_act_bn_out", "shared_bn_out", "shared_sigmoid_out"]
    return b.build(
        model_name=name, opset=13,
        doc="BatchNormalization nodes that must NOT be folded, each for a different reason.",
        shows="refusals: BN on a graph input, BN after a non-linearity, BN whose Conv output has another reader",
        inputs=[float_input("input", ["N", channels, size, size])],
        outputs=[helper.make_tensor_value_info(o, FLOAT, ["N", channels, size, size]) for o in outputs],
    )


SAMPLE_MODELS = {
    "resnet_block": resnet_block,
    "mlp_bn1d": mlp_bn1d,
    "decoder_convtranspose": decoder_convtranspose,
    "training_bn": training_bn,
    "bias_add": bias_add,
    "unfoldable_bn": unfoldable_bn,
}


def main():
    default_out = pathlib.Path(__file__).resolve().parent.parent / "models"
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=pathlib.Path, default=default_out, help=f"output directory (default {default_out})")
    args = parser.parse_args()

    try:
        args.out.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        sys.exit(f"gen_models: cannot create output directory {args.out}: {error.strerror}")

    for name, build in SAMPLE_MODELS.items():
        model = build()
        try:
            onnx.checker.check_model(model, full_check=True)
        except onnx.checker.ValidationError as error:
            sys.exit(f"gen_models: generated {name}.onnx fails the ONNX checker: {error}")
        path = args.out / f"{name}.onnx"
        data = model.SerializeToString()
        try:
            path.write_bytes(data)
        except OSError as error:
            sys.exit(f"gen_models: cannot write {path}: {error.strerror}")
        print(f"{path}  {len(data)} bytes")


if __name__ == "__main__":
    main()
