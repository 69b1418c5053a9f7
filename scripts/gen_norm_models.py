#!/usr/bin/python3
"""Write small models whose normalizations are shaped like real exporters' output, for the norm-fuse suite test and
the LayerNorm comparison with ONNX Runtime (scripts/compare_bn.py --norms).

Each model reproduces the op chain one exporter family writes for a LayerNorm, RMSNorm or GroupNorm (issue 40):
  gpt_block_opset14 / _opset17   PyTorch (torch.onnx, TorchScript exporter): ReduceMean, Sub, Pow(2), ReduceMean,
                                 Add(eps), Sqrt, Div, Mul(gamma), Add(beta) around an attention block and an MLP
  bert_layer_tf_opset11 / _17    tf2onnx / keras2onnx: s = gamma * 1/sqrt(var + eps); y = x * s + (beta - mean * s)
  flax_layernorm_opset13 / _17   jax2onnx-style: Var = E[x^2] - E[x]^2 clamped by Max(0, .), x - mean times rsqrt
  llama_rmsnorm_fp16_opset14/23  Hugging Face LLaMA in float16: Cast to float, Pow(2), ReduceMean, Add(eps), Sqrt,
                                 Reciprocal, Mul, Cast back, Mul(gamma)
  diffusion_groupnorm_opset14/21 diffusers' GroupNorm as exported: Reshape [N, G, -1], InstanceNormalization (scale
                                 1, bias 0), Reshape back, Mul(gamma), Add(beta), SiLU
The models below the fused op's opset (LayerNormalization 17, RMSNormalization 23, GroupNormalization 21) are
there to be folded as they are and with --target-opset 17. Weights are seeded (deterministic bytes); every model runs in ONNX Runtime 1.30.

Uses Debian's python3-onnx and python3-numpy, hence /usr/bin/python3.

Usage: scripts/gen_norm_models.py OUT_DIR
"""

import argparse
import pathlib
import zlib

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

HIDDEN = 32
SEQUENCE = 8


class Builder:
    def __init__(self, name, opset):
        self.name = name
        self.opset = opset
        self.rng = np.random.default_rng(zlib.crc32(name.encode()))
        self.nodes = []
        self.inits = []
        self.count = 0

    def fresh(self, hint):
        self.count += 1
        return f"{hint}_{self.count}"

    def init(self, hint, array, dtype=np.float32):
        name = self.fresh(hint)
        self.inits.append(numpy_helper.from_array(np.ascontiguousarray(array, dtype=dtype), name))
        return name

    def node(self, op, inputs, **attrs):
        output = self.fresh(op.lower())
        self.nodes.append(helper.make_node(op, inputs, [output], name=self.fresh(op), **attrs))
        return output

    def reduce_mean(self, x, axes):
        """ReduceMean keeping dims: axes as an attribute up to opset 17, as an input from 18."""
        if self.opset >= 18:
            return self.node("ReduceMean", [x, self.init("axes", axes, np.int64)])
        return self.node("ReduceMean", [x], axes=axes)

    def linear(self, x, n_in, n_out, dtype=np.float32):
        w = self.init("weight", self.rng.standard_normal((n_in, n_out)) / np.sqrt(n_in), dtype)
        b = self.init("bias", self.rng.normal(0.0, 0.1, n_out), dtype)
        return self.node("Add", [self.node("MatMul", [x, w]), b])

    def gamma_beta(self, shape, dtype=np.float32):
        return (self.init("gamma", self.rng.uniform(0.5, 1.5, shape), dtype),
                self.init("beta", self.rng.normal(0.0, 0.2, shape), dtype))

    def finish(self, shape, elem_type=TensorProto.FLOAT):
        """The model from input x to output y (the last node's output), both of `shape`."""
        self.nodes[-1].output[0] = "y"
        inputs = [helper.make_tensor_value_info("x", elem_type, shape)]
        outputs = [helper.make_tensor_value_info("y", elem_type, shape)]
        graph = helper.make_graph(self.nodes, self.name, inputs, outputs, self.inits)
        ir_version = 8 if self.opset <= 17 else 10
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", self.opset)], ir_version=ir_version,
                                 producer_name="bnfold gen_norm_models.py")


def pytorch_layer_norm(b, x):
    gamma, beta = b.gamma_beta(HIDDEN)
    mean = b.reduce_mean(x, [-1])
    d = b.node("Sub", [x, mean])
    var = b.reduce_mean(b.node("Pow", [d, b.init("two", np.array(2.0))]), [-1])
    s = b.node("Sqrt", [b.node("Add", [var, b.init("eps", np.array(1e-5))])])
    return b.node("Add", [b.node("Mul", [b.node("Div", [d, s]), gamma]), beta])


def gelu(b, x):
    erf = b.node("Erf", [b.node("Div", [x, b.init("sqrt2", np.array(np.sqrt(2.0)))])])
    return b.node("Mul", [b.node("Mul", [x, b.node("Add", [erf, b.init("one", np.array(1.0))])]),
                          b.init("half", np.array(0.5))])


def gpt_block(opset):
    """Pre-norm transformer block: x + Attn(LN1(x)), then + MLP(LN2(.)); single head."""
    b = Builder(f"gpt_block_opset{opset}", opset)
    x = "x"
    h = pytorch_layer_norm(b, x)
    q, k, v = (b.linear(h, HIDDEN, HIDDEN) for _ in range(3))
    scores = b.node("Div", [b.node("MatMul", [q, b.node("Transpose", [k], perm=[0, 2, 1])]),
                            b.init("scale", np.array(np.sqrt(HIDDEN)))])
    attention = b.node("MatMul", [b.node("Softmax", [scores], axis=-1), v])
    x1 = b.node("Add", [x, b.linear(attention, HIDDEN, HIDDEN)])
    h2 = pytorch_layer_norm(b, x1)
    mlp = b.linear(gelu(b, b.linear(h2, HIDDEN, 4 * HIDDEN)), 4 * HIDDEN, HIDDEN)
    b.node("Add", [x1, mlp])
    return b.finish([1, SEQUENCE, HIDDEN])


def tf_layer_norm(b, x):
    """tf.keras LayerNormalization through tf2onnx: the affine folded into one scale and one shift."""
    gamma, beta = b.gamma_beta(HIDDEN)
    mean = b.reduce_mean(x, [-1])
    diff = b.node("Sub", [x, mean])
    var = b.reduce_mean(b.node("Mul", [diff, diff]), [-1])
    rsqrt = b.node("Reciprocal", [b.node("Sqrt", [b.node("Add", [var, b.init("eps", np.array(1e-12))])])])
    s = b.node("Mul", [rsqrt, gamma])
    shift = b.node("Sub", [beta, b.node("Mul", [mean, s])])
    return b.node("Add", [b.node("Mul", [x, s]), shift])


def bert_layer_tf(opset):
    """BERT encoder layer as tf2onnx writes it: attention output + residual, LN, FFN + residual, LN."""
    b = Builder(f"bert_layer_tf_opset{opset}", opset)
    x = "x"
    q, k, v = (b.linear(x, HIDDEN, HIDDEN) for _ in range(3))
    scores = b.node("Mul", [b.node("MatMul", [q, b.node("Transpose", [k], perm=[0, 2, 1])]),
                            b.init("scale", np.array(1.0 / np.sqrt(HIDDEN)))])
    attention = b.node("MatMul", [b.node("Softmax", [scores], axis=-1), v])
    h = tf_layer_norm(b, b.node("Add", [b.linear(attention, HIDDEN, HIDDEN), x]))
    ffn = b.linear(gelu(b, b.linear(h, HIDDEN, 4 * HIDDEN)), 4 * HIDDEN, HIDDEN)
    tf_layer_norm(b, b.node("Add", [ffn, h]))
    return b.finish([2, SEQUENCE, HIDDEN])


def flax_layernorm(opset):
    """flax.linen.LayerNorm: Var = E[x^2] - E[x]^2, clamped at 0; (x - mean) * rsqrt(var + eps) * scale + bias."""
    b = Builder(f"flax_layernorm_opset{opset}", opset)
    gamma, beta = b.gamma_beta(HIDDEN)
    x = "x"
    mean = b.reduce_mean(x, [-1])
    mean_sq = b.reduce_mean(b.node("Mul", [x, x]), [-1])
    var = b.node("Max", [b.node("Sub", [mean_sq, b.node("Mul", [mean, mean])]), b.init("zero", np.array(0.0))])
    rsqrt = b.node("Reciprocal", [b.node("Sqrt", [b.node("Add", [var, b.init("eps", np.array(1e-6))])])])
    n = b.node("Mul", [b.node("Sub", [x, mean]), rsqrt])
    b.node("Add", [b.node("Mul", [n, gamma]), beta])
    return b.finish([2, SEQUENCE, HIDDEN])


def llama_rms_norm(b, x):
    gamma = b.init("weight", b.rng.uniform(0.5, 1.5, HIDDEN), np.float16)
    xf = b.node("Cast", [x], to=TensorProto.FLOAT)
    var = b.reduce_mean(b.node("Pow", [xf, b.init("two", np.array(2.0))]), [-1])
    r = b.node("Reciprocal", [b.node("Sqrt", [b.node("Add", [var, b.init("eps", np.array(1e-6))])])])
    n = b.node("Cast", [b.node("Mul", [xf, r])], to=TensorProto.FLOAT16)
    return b.node("Mul", [gamma, n])


def llama_rmsnorm_fp16(opset):
    """Two LLaMA RMSNorms in float16 with a residual between them (h = x + norm(x); y = h + norm(h))."""
    b = Builder(f"llama_rmsnorm_fp16_opset{opset}", opset)
    x = "x"
    h = b.node("Add", [x, llama_rms_norm(b, x)])
    b.node("Add", [h, llama_rms_norm(b, h)])
    return b.finish([1, SEQUENCE, HIDDEN], TensorProto.FLOAT16)


def diffusion_groupnorm(opset):
    """diffusers' ResNet block norm: GroupNorm(2 groups of 4 channels) written through InstanceNormalization, SiLU."""
    b = Builder(f"diffusion_groupnorm_opset{opset}", opset)
    channels, groups = 8, 2
    gamma, beta = b.gamma_beta([channels, 1, 1])
    grouped = b.node("Reshape", ["x", b.init("group_shape", [1, groups, -1], np.int64)])
    normalized = b.node("InstanceNormalization", [grouped, b.init("ones", np.ones(groups)),
                                                  b.init("zeros", np.zeros(groups))], epsilon=1e-5)
    back = b.node("Reshape", [normalized, b.init("shape", [1, channels, 4, 4], np.int64)])
    g = b.node("Add", [b.node("Mul", [back, gamma]), beta])
    b.node("Mul", [g, b.node("Sigmoid", [g])])
    return b.finish([1, channels, 4, 4])


MODELS = {
    "gpt_block_opset14": lambda: gpt_block(14),
    "gpt_block_opset17": lambda: gpt_block(17),
    "bert_layer_tf_opset11": lambda: bert_layer_tf(11),
    "bert_layer_tf_opset17": lambda: bert_layer_tf(17),
    "flax_layernorm_opset13": lambda: flax_layernorm(13),
    "flax_layernorm_opset17": lambda: flax_layernorm(17),
    "llama_rmsnorm_fp16_opset14": lambda: llama_rmsnorm_fp16(14),
    "llama_rmsnorm_fp16_opset23": lambda: llama_rmsnorm_fp16(23),
    "diffusion_groupnorm_opset14": lambda: diffusion_groupnorm(14),
    "diffusion_groupnorm_opset21": lambda: diffusion_groupnorm(21),
}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out_dir")
    args = parser.parse_args()
    out = pathlib.Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for name, build in MODELS.items():
        onnx.save(build(), str(out / f"{name}.onnx"))
        print(out / f"{name}.onnx")


if __name__ == "__main__":
    main()
