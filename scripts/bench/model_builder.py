"""Shared pieces of the benchmark model generators (scripts/bench/gen_*.py).

A GraphBuilder collects nodes and random initializers and emits layer + BatchNormalization blocks the way
exporters write un-folded models: the layer has no bias (or a bias the BN will absorb), the BN follows it in
inference mode, with parameters in a trained network's range so outputs stay finite and a fold is checkable
numerically. Uses Debian's python3-onnx (1.12) and python3-numpy, hence /usr/bin/python3.
"""

import pathlib
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

IR_VERSION = 8
DEFAULT_OPSET = 13


class GraphBuilder:
    def __init__(self, seed):
        self.rng = np.random.default_rng(seed)
        self.nodes = []
        self.initializers = []
        self.bn_count = 0

    def initializer(self, name, array, dtype=np.float32):
        self.initializers.append(numpy_helper.from_array(np.ascontiguousarray(array, dtype=dtype), name))
        return name

    def he_weight(self, shape, fan_in):
        weight = self.rng.standard_normal(shape, dtype=np.float32)
        weight *= np.float32(np.sqrt(2.0 / fan_in))
        return weight

    def node(self, op_type, inputs, output, name, **attributes):
        self.nodes.append(helper.make_node(op_type, inputs, [output], name=name, **attributes))
        return output

    def batch_norm(self, x, name, channels, scale_range=(0.5, 1.5)):
        """Inference-mode BatchNormalization over `channels` (axis 1)."""
        params = (
            ("weight", self.rng.uniform(*scale_range, channels)),
            ("bias", self.rng.normal(0.0, 0.1, channels)),
            ("running_mean", self.rng.normal(0.0, 0.1, channels)),
            # Near the variance of a He-initialized layer's output, so BN keeps activations around unit scale.
            ("running_var", self.rng.uniform(1.0, 3.0, channels)),
        )
        inputs = [x] + [self.initializer(f"{name}.{field}", value) for field, value in params]
        self.bn_count += 1
        return self.node("BatchNormalization", inputs, f"{name}_out", name, epsilon=1e-5, momentum=0.9)

    def relu(self, x, name):
        return self.node("Relu", [x], f"{name}_out", name)

    def relu6(self, x, name):
        # Clip's bounds are inputs from opset 11 on: shared scalar initializers, as PyTorch exports ReLU6.
        if not any(t.name == "relu6.min" for t in self.initializers):
            self.initializer("relu6.min", np.array(0.0))
            self.initializer("relu6.max", np.array(6.0))
        return self.node("Clip", [x, "relu6.min", "relu6.max"], f"{name}_out", name)


def make_model(builder, graph_name, inputs, outputs, doc, generator, seed, opset=DEFAULT_OPSET):
    graph = helper.make_graph(builder.nodes, graph_name, inputs, outputs, builder.initializers, doc_string=doc)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)],
                              producer_name=f"bnfold-{graph_name}-generator", producer_version="1")
    model.ir_version = IR_VERSION
    helper.set_model_props(model, {"generator": generator, "seed": str(seed)})
    return model


def float_input(name, shape):
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)


def check_and_save(model, out, program, full_check=True):
    """Checks the model with onnx's checker and writes it; exits with one line naming the file on failure."""
    onnx.checker.check_model(model, full_check=full_check)
    out = pathlib.Path(out)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_bytes(model.SerializeToString())
    except OSError as error:
        sys.exit(f"{program}: cannot write {error.filename or out}: {error.strerror}")
    print(f"{out}  {out.stat().st_size} bytes, {len(model.graph.node)} nodes")


def positive_int(text):
    value = int(text)
    if value <= 0:
        raise ValueError(text)
    return value
