#!/usr/bin/python3
"""Write small models shaped like real exporters' output, for the BatchNormalization comparison with ONNX Runtime.

Each model reproduces what one exporter family writes around BatchNormalization (see shared ONNX notes, "What
exporters write"): unsorted node lists, weights behind Identity / ConstantOfShape / Cast / Reshape chains,
Constant nodes, layout ops between a layer and its BN, a BN -> Flatten -> Linear head, Concat blocks, and
initializers listed as graph inputs. Weights are seeded (deterministic bytes); every model runs in ONNX Runtime.

Uses Debian's python3-onnx and python3-numpy, hence /usr/bin/python3.

Usage: scripts/gen_exporter_models.py OUT_DIR
Writes OUT_DIR/<family>.onnx and OUT_DIR/expected.json: for each model, whether bnfold must remove every BN from it
with the default rules ("all") or leaves them by policy ("policy": initializers that are also graph inputs).
"""

import argparse
import json
import pathlib
import random
import zlib

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

FLOAT = TensorProto.FLOAT


class Builder:
    def __init__(self, name):
        self.name = name
        self.rng = np.random.default_rng(zlib.crc32(name.encode()))
        self.nodes = []
        self.inits = []
        self.count = 0

    def fresh(self, hint):
        self.count += 1
        return f"{hint}_{self.count}"

    def init(self, name, array, dtype=np.float32):
        self.inits.append(numpy_helper.from_array(np.ascontiguousarray(array, dtype=dtype), name))
        return name

    def weight(self, name, shape, fan_in):
        return self.init(name, self.rng.standard_normal(shape) * np.sqrt(2.0 / fan_in))

    def bn_values(self, channels):
        sign = self.rng.choice([-1.0, 1.0], size=channels, p=[0.2, 0.8])
        return (self.rng.uniform(0.5, 1.5, channels) * sign, self.rng.normal(0.0, 0.5, channels),
                self.rng.normal(0.0, 0.5, channels), self.rng.uniform(0.5, 2.0, channels))

    def bn_params(self, prefix, channels):
        gamma, beta, mean, var = self.bn_values(channels)
        return [self.init(f"{prefix}.weight", gamma), self.init(f"{prefix}.bias", beta),
                self.init(f"{prefix}.running_mean", mean), self.init(f"{prefix}.running_var", var)]

    def node(self, op, inputs, outputs=None, name=None, **attrs):
        outputs = outputs or [self.fresh(op.lower())]
        self.nodes.append(helper.make_node(op, inputs, outputs, name=name or self.fresh(op), **attrs))
        return outputs[0]

    def constant_node(self, array, dtype=np.float32):
        tensor = numpy_helper.from_array(np.ascontiguousarray(array, dtype=dtype), self.fresh("const"))
        return self.node("Constant", [], value=tensor)

    def model(self, inputs, outputs, opset, ir_version=8, shuffle=False, inits_as_inputs=False):
        nodes = list(self.nodes)
        if shuffle:
            random.Random(zlib.crc32(self.name.encode())).shuffle(nodes)
        graph_inputs = list(inputs)
        if inits_as_inputs:
            graph_inputs += [helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)) for t in self.inits]
        graph = helper.make_graph(nodes, self.name, graph_inputs, outputs, self.inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], producer_name=f"bnfold {self.name}-style")
        model.ir_version = ir_version
        return model


def keras():
    """keras2onnx/tf2onnx: NHWC input, Transpose sandwiches around every Conv and BN, a Dense head (MatMul + Add),
    and a node list that is not topologically sorted."""
    b = Builder("keras")
    x = "input_1"
    t = b.node("Transpose", [x], perm=[0, 3, 1, 2])
    channels = 3
    for i, out in enumerate([8, 8]):
        c = b.node("Conv", [t, b.weight(f"conv{i}/kernel", (out, channels, 3, 3), 9 * channels),
                            b.init(f"conv{i}/bias", b.rng.normal(0, 0.1, out))], pads=[1, 1, 1, 1])
        h = b.node("Transpose", [c], perm=[0, 2, 3, 1])          # back to NHWC after the conv
        i_ = b.node("Identity", [h])
        n = b.node("Transpose", [i_], perm=[0, 3, 1, 2])          # to NCHW for the BN
        bn = b.node("BatchNormalization", [n] + b.bn_params(f"bn{i}", out), epsilon=1e-3)
        h2 = b.node("Transpose", [bn], perm=[0, 2, 3, 1])
        r = b.node("Relu", [h2])
        t = b.node("Transpose", [r], perm=[0, 3, 1, 2])
        channels = out
    pooled = b.node("GlobalAveragePool", [t])
    flat = b.node("Flatten", [pooled])
    dense = b.node("MatMul", [flat, b.weight("dense/kernel", (channels, 4), channels)])
    y = b.node("Add", [dense, b.init("dense/bias", b.rng.normal(0, 0.1, 4))], outputs=["dense_out"])
    return b.model([helper.make_tensor_value_info(x, FLOAT, ["N", 8, 8, 3])],
                   [helper.make_tensor_value_info(y, FLOAT, ["N", 4])], 13, shuffle=True)


def caffe2():
    """caffe2 "light" models: weights and BN parameters filled by ConstantOfShape of a constant shape, SpatialBN
    exported at opset 9."""
    b = Builder("caffe2")
    x = "data"
    channels, t = 3, x
    for i, out in enumerate([6, 6]):
        shape = b.init(f"conv{i}_w_shape", [out, channels, 1, 1], np.int64)
        w = b.node("ConstantOfShape", [shape], value=numpy_helper.from_array(np.array([0.25 + 0.1 * i], np.float32)))
        bias_shape = b.init(f"conv{i}_b_shape", [out], np.int64)
        bias = b.node("ConstantOfShape", [bias_shape])  # zeros
        c = b.node("Conv", [t, w, bias])
        gamma, beta, mean, var = b.bn_values(out)
        ones = b.node("ConstantOfShape", [bias_shape], value=numpy_helper.from_array(np.array([1.0], np.float32)))
        bn = b.node("BatchNormalization", [c, ones, b.init(f"bn{i}_b", beta), b.init(f"bn{i}_rm", mean),
                                           b.init(f"bn{i}_riv", var)], epsilon=1e-5)
        t = b.node("Relu", [bn])
        channels = out
    # The other weights of the net are plain initializers.
    c = b.node("Conv", [t, b.weight("conv_last_w", (4, channels, 3, 3), 9 * channels)], pads=[1, 1, 1, 1])
    y = b.node("BatchNormalization", [c] + b.bn_params("bn_last", 4), outputs=["prob"], epsilon=1e-5)
    return b.model([helper.make_tensor_value_info(x, FLOAT, [1, 3, 6, 6])],
                   [helper.make_tensor_value_info(y, FLOAT, [1, 4, 6, 6])], 9)


def pytorch():
    """PyTorch 1.x (opset 11-13): Conv -> BN -> Relu blocks whose BN statistics are read through Identity of
    de-duplicated tensors, and a BatchNorm2d -> Flatten -> Linear head."""
    b = Builder("pytorch")
    x = "input.1"
    c1 = b.node("Conv", [x, b.weight("conv1.weight", (4, 3, 3, 3), 27)], pads=[1, 1, 1, 1])
    p1 = b.bn_params("bn1", 4)
    bn1 = b.node("BatchNormalization", [c1] + p1, epsilon=1e-5)
    r1 = b.node("Relu", [bn1])
    # Equal statistics were stored once; the exporter reads them through Identity.
    c2 = b.node("Conv", [r1, b.weight("conv2.weight", (4, 4, 1, 1), 4)])
    m2 = b.node("Identity", [p1[2]], outputs=["bn2.running_mean"])
    v2 = b.node("Identity", [p1[3]], outputs=["bn2.running_var"])
    gamma, beta, _, _ = b.bn_values(4)
    bn2 = b.node("BatchNormalization", [c2, b.init("bn2.weight", gamma), b.init("bn2.bias", beta), m2, v2], epsilon=1e-5)
    r2 = b.node("Relu", [bn2])
    pooled = b.node("MaxPool", [r2], kernel_shape=[2, 2], strides=[2, 2])
    bn3 = b.node("BatchNormalization", [pooled] + b.bn_params("bn3", 4), epsilon=1e-5)
    flat = b.node("Flatten", [bn3], axis=1)
    y = b.node("Gemm", [flat, b.weight("fc.weight", (5, 16), 16), b.init("fc.bias", b.rng.normal(0, 0.1, 5))],
               outputs=["output"], alpha=1.0, beta=1.0, transB=1)
    return b.model([helper.make_tensor_value_info(x, FLOAT, ["batch", 3, 4, 4])],
                   [helper.make_tensor_value_info(y, FLOAT, ["batch", 5])], 11)


def pytorch_old_mlp():
    """Old PyTorch (opset 9): BatchNorm1d after Linear written as Gemm -> Unsqueeze -> BN -> Squeeze."""
    b = Builder("pytorch_old_mlp")
    t, features = "input", 6
    for i, out in enumerate([8, 8, 3]):
        g = b.node("Gemm", [t, b.weight(f"{i}.weight", (out, features), features), b.init(f"{i}.bias", b.rng.normal(0, 0.1, out))],
                   transB=1)
        u = b.node("Unsqueeze", [g], axes=[2])
        bn = b.node("BatchNormalization", [u] + b.bn_params(f"bn{i}", out), epsilon=1e-5)
        t = b.node("Squeeze", [bn], axes=[2])
        if i < 2:
            t = b.node("Relu", [t])
        features = out
    b.nodes[-1].output[0] = "output"
    return b.model([helper.make_tensor_value_info("input", FLOAT, [5, 6])],
                   [helper.make_tensor_value_info("output", FLOAT, [5, 3])], 9, ir_version=4)


def pytorch_inputs():
    """PyTorch before 1.5: every initializer is also listed as a graph input (keep_initializers_as_inputs)."""
    b = Builder("pytorch_inputs")
    c = b.node("Conv", ["input", b.weight("conv.weight", (4, 3, 3, 3), 27)], pads=[1, 1, 1, 1])
    bn = b.node("BatchNormalization", [c] + b.bn_params("bn", 4), epsilon=1e-5)
    y = b.node("Relu", [bn], outputs=["output"])
    return b.model([helper.make_tensor_value_info("input", FLOAT, [1, 3, 5, 5])],
                   [helper.make_tensor_value_info(y, FLOAT, [1, 4, 5, 5])], 9, ir_version=4, inits_as_inputs=True)


def paddle():
    """Paddle2ONNX: every weight and BN parameter a Constant node."""
    b = Builder("paddle")
    t, channels = "x", 3
    for i, out in enumerate([4, 4]):
        w = b.constant_node(b.rng.standard_normal((out, channels, 3, 3)) * np.sqrt(2.0 / (9 * channels)))
        c = b.node("Conv", [t, w], pads=[1, 1, 1, 1])
        params = [b.constant_node(v) for v in b.bn_values(out)]
        bn = b.node("BatchNormalization", [c] + params, epsilon=1e-5, momentum=0.9)
        t = b.node("Relu", [bn])
        channels = out
    b.nodes[-1].output[0] = "out"
    return b.model([helper.make_tensor_value_info("x", FLOAT, [1, 3, 6, 6])],
                   [helper.make_tensor_value_info("out", FLOAT, [1, 4, 6, 6])], 12)


def cntk():
    """CNTK-style: unsorted nodes, BN scale from Reshape of a [1, C] constant and variance as Add(var, eps) of
    constants; an MXNet-style Cast of float16 weights."""
    b = Builder("cntk")
    t = "features"
    w16 = b.init("w16", b.rng.standard_normal((6, 3, 3, 3)) * 0.2, np.float16)
    w = b.node("Cast", [w16], to=FLOAT)
    c = b.node("Conv", [t, w], pads=[1, 1, 1, 1])
    gamma, beta, mean, var = b.bn_values(6)
    scale = b.node("Reshape", [b.init("scale_2d", gamma.reshape(1, 6)), b.init("flat", [-1], np.int64)])
    v = b.node("Add", [b.init("var0", var), b.init("eps_extra", np.array(1e-3))])
    bn = b.node("BatchNormalization", [c, scale, b.init("beta", beta), b.init("mean", mean), v], epsilon=1e-5)
    y = b.node("Relu", [bn], outputs=["z"])
    return b.model([helper.make_tensor_value_info(t, FLOAT, [1, 3, 5, 5])],
                   [helper.make_tensor_value_info(y, FLOAT, [1, 6, 5, 5])], 13, shuffle=True)


def inception():
    """An Inception-style block: three Convs concatenated on the channel axis, then one BN."""
    b = Builder("inception")
    x = "x"
    branches = [
        b.node("Conv", [x, b.weight("b1.w", (2, 4, 1, 1), 4)]),
        b.node("Conv", [x, b.weight("b2.w", (3, 4, 3, 3), 36), b.init("b2.b", b.rng.normal(0, 0.1, 3))], pads=[1, 1, 1, 1]),
        b.node("Conv", [x, b.weight("b3.w", (4, 2, 1, 1), 2)], group=2),
    ]
    cat = b.node("Concat", branches, axis=1)
    bn = b.node("BatchNormalization", [cat] + b.bn_params("bn", 9), epsilon=1e-3)
    y = b.node("Relu", [bn], outputs=["y"])
    return b.model([helper.make_tensor_value_info(x, FLOAT, [1, 4, 5, 5])],
                   [helper.make_tensor_value_info(y, FLOAT, [1, 9, 5, 5])], 13)


# family -> (builder, what bnfold's default rules must do: "all" BNs removed, or "policy": left by policy)
MODELS = {
    "keras": (keras, "all"),
    "caffe2": (caffe2, "all"),
    "pytorch": (pytorch, "all"),
    "pytorch_old_mlp": (pytorch_old_mlp, "all"),
    "pytorch_inputs": (pytorch_inputs, "policy"),
    "paddle": (paddle, "all"),
    "cntk": (cntk, "all"),
    "inception": (inception, "all"),
}


def main():
    # argparse, so that "--help" prints the usage instead of becoming the output directory's name.
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out_dir", type=pathlib.Path, help="directory to write the models and expected.json into")
    out = parser.parse_args().out_dir
    out.mkdir(parents=True, exist_ok=True)
    expected = {}
    for family, (build, expectation) in MODELS.items():
        model = build()
        onnx.save(model, out / f"{family}.onnx")
        expected[f"{family}.onnx"] = expectation
    (out / "expected.json").write_text(json.dumps(expected, indent=2, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
