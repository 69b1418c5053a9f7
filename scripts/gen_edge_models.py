#!/usr/bin/python3
"""Write small models for the emitted forms and messages that depend on the opset or on refusals.

Each model is stated in ONNX text: opset-6 legacy broadcasting (MatMul -> Gemm, MatMul -> Add, Gemm's C, Mul/Add
of a decomposition, a training expansion), refusals whose messages name nodes and dims, and a tensor whose data
does not match its dims. Used by scripts/compare_binaries.sh to hold two builds of bnfold to the same bytes.

Uses Debian's python3-onnx, hence /usr/bin/python3.

Usage: scripts/gen_edge_models.py OUT_DIR
"""

import argparse
import pathlib

import onnx
import onnx.parser
from onnx import TensorProto

MODELS = {
    # bn-fold: a 2-D MatMul becomes Gemm(X, W', shift) with broadcast=1.
    "fold_matmul_2d_opset6": """<ir_version: 3, opset_import: ["" : 6]>
g (float[2,2] x) => (float[2,2] y)
<float[2,2] w = {1, 2, 3, 4}, float[2] s = {2, -0.5}, float[2] b = {1, 0.5}, float[2] m = {0.5, 0}, float[2] v = {3, 0.25}>
{
  h = MatMul (x, w)
  y = BatchNormalization <is_test = 1> (h, s, b, m, v)
}
""",
    # bn-fold through a Transpose into a rank-3 MatMul: the shift goes into an Add on the last axis.
    "fold_matmul_3d_opset6": """<ir_version: 3, opset_import: ["" : 6]>
g (float[1,4,2] x) => (float[1,3,4] y)
<float[2,3] w = {1, 2, 3, 4, 5, 6}, float[3] s = {2, -0.5, 1.5}, float[3] b = {1, 0.5, -1}, float[3] m = {0.5, 0, 1}, float[3] v = {3, 0.25, 1}>
{
  h = MatMul (x, w)
  t = Transpose <perm = [0, 2, 1]> (h)
  y = BatchNormalization <is_test = 1> (t, s, b, m, v)
}
""",
    "fold_matmul_3d_opset13": """<ir_version: 7, opset_import: ["" : 13]>
g (float[1,4,2] x) => (float[1,3,4] y)
<float[2,3] w = {1, 2, 3, 4, 5, 6}, float[3] s = {2, -0.5, 1.5}, float[3] b = {1, 0.5, -1}, float[3] m = {0.5, 0, 1}, float[3] v = {3, 0.25, 1}>
{
  h = MatMul (x, w)
  t = Transpose <perm = [0, 2, 1]> (h)
  y = BatchNormalization (t, s, b, m, v)
}
""",
    # bn-fold into a Gemm whose C is [N]: C needs broadcast=1 below opset 7.
    "fold_gemm_opset6": """<ir_version: 3, opset_import: ["" : 6]>
g (float[2,2] x) => (float[2,2] y)
<float[2,2] w = {1, 2, 3, 4}, float[2] c = {0.25, -1}, float[2] s = {2, -0.5}, float[2] b = {1, 0.5}, float[2] m = {0.5, 0}, float[2] v = {3, 0.25}>
{
  h = Gemm <broadcast = 1> (x, w, c)
  y = BatchNormalization <is_test = 1> (h, s, b, m, v)
}
""",
    "fold_gemm_full_c_opset6": """<ir_version: 3, opset_import: ["" : 6]>
g (float[2,2] x) => (float[2,2] y)
<float[2,2] w = {1, 2, 3, 4}, float[2,2] c = {0.25, -1, 2, 3}, float[2] s = {2, -0.5}, float[2] b = {1, 0.5}, float[2] m = {0.5, 0}, float[2] v = {3, 0.25}>
{
  h = Gemm <beta = 0.5> (x, w, c)
  y = BatchNormalization <is_test = 1> (h, s, b, m, v)
}
""",
    # bn-forward: the BN's shift pushed through Flatten and a MatMul needs a bias, so the MatMul becomes a Gemm.
    "forward_matmul_opset6": """<ir_version: 3, opset_import: ["" : 6]>
g (float[1,2,2,2] x) => (float[1,3] y)
<float[8,3] w = {1,2,3, 4,5,6, 7,8,9, 1,0,1, 0,1,0, 2,2,2, 1,1,0, 0,0,3}, float[2] s = {2, -0.5}, float[2] b = {1, 0.5}, float[2] m = {0.5, 0}, float[2] v = {3, 0.25}>
{
  n = BatchNormalization <is_test = 1> (x, s, b, m, v)
  f = Flatten <axis = 1> (n)
  y = MatMul (f, w)
}
""",
    "forward_matmul_opset15": """<ir_version: 8, opset_import: ["" : 15]>
g (float[1,2,2,2] x) => (float[1,3] y)
<float[8,3] w = {1,2,3, 4,5,6, 7,8,9, 1,0,1, 0,1,0, 2,2,2, 1,1,0, 0,0,3}, float[2] s = {2, -0.5}, float[2] b = {1, 0.5}, float[2] m = {0.5, 0}, float[2] v = {3, 0.25}>
{
  n = BatchNormalization (x, s, b, m, v)
  f = Flatten <axis = 1> (n)
  y = MatMul (f, w)
}
""",
    "forward_gemm_opset6": """<ir_version: 3, opset_import: ["" : 6]>
g (float[2,2] x) => (float[2,3] y)
<float[2,3] w = {1, 2, 3, 4, 5, 6}, float[3] c = {1, 1, 1}, float[2] s = {2, -0.5}, float[2] b = {1, 0.5}, float[2] m = {0.5, 0}, float[2] v = {3, 0.25}>
{
  n = BatchNormalization <is_test = 1> (x, s, b, m, v)
  y = Gemm <broadcast = 1, alpha = 0.5> (n, w, c)
}
""",
    # bias-add: MatMul + [N] constant becomes a Gemm.
    "bias_add_matmul_opset13": """<ir_version: 7, opset_import: ["" : 13]>
g (float[2,2] x) => (float[2,3] y)
<float[2,3] w = {1, 2, 3, 4, 5, 6}, float[3] k = {0.5, -1, 2}>
{
  h = MatMul (x, w)
  y = Add (h, k)
}
""",
    "bias_add_matmul_3d_opset13": """<ir_version: 7, opset_import: ["" : 13]>
g (float[1,2,2] x) => (float[1,2,3] y)
<float[2,3] w = {1, 2, 3, 4, 5, 6}, float[3] k = {0.5, -1, 2}>
{
  h = MatMul (x, w)
  y = Add (h, k)
}
""",
    # bn-decompose (with --rules all): Mul and Add with broadcast=1, axis=1 below opset 7.
    "decompose_opset6": """<ir_version: 3, opset_import: ["" : 6]>
g (float[1,2,3,3] x) => (float[1,2,3,3] y)
<float[2] s = {2, -0.5}, float[2] b = {1, 0.5}, float[2] m = {0.5, 0}, float[2] v = {3, 0.25}>
{
  r = Relu (x)
  y = BatchNormalization <is_test = 1> (r, s, b, m, v)
}
""",
    "decompose_spatial0_opset6": """<ir_version: 3, opset_import: ["" : 6]>
g (float[1,2,3] x) => (float[1,2,3] y)
<float[2,3] s = {2, -0.5, 1, 1, 1, 1}, float[2,3] b = {1, 0.5, 0, 0, 0, 1}, float[2,3] m = {0.5, 0, 0, 0, 0, 0}, float[2,3] v = {3, 0.25, 1, 1, 1, 1}>
{
  r = Relu (x)
  y = BatchNormalization <is_test = 1, spatial = 0> (r, s, b, m, v)
}
""",
    # train-bn-expand at opset 6 (legacy broadcasting) and 15.
    "expand_training_opset6": """<ir_version: 3, opset_import: ["" : 6]>
g (float[2,2,3] x) => (float[2,2,3] y)
<float[2] s = {2, -0.5}, float[2] b = {1, 0.5}, float[2] m = {0.5, 0}, float[2] v = {3, 0.25}>
{
  r = Relu (x)
  y = BatchNormalization (r, s, b, m, v)
}
""",
    "expand_training_opset15": """<ir_version: 8, opset_import: ["" : 15]>
g (float[2,2,3] x) => (float[2,2,3] y, float[2] rm, float[2] rv)
<float[2] s = {2, -0.5}, float[2] b = {1, 0.5}, float[2] m = {0.5, 0}, float[2] v = {3, 0.25}>
{
  r = Relu (x)
  y, rm, rv = BatchNormalization <training_mode = 1> (r, s, b, m, v)
}
""",
    # Refusals: a Reshape that merges the channel axis, mismatched parameter dims, a Mul that could broadcast.
    "refuse_reshape_merge": """<ir_version: 8, opset_import: ["" : 15]>
g (float[2,6] x) => (float[2,2,3] y)
<float[6,6] w = {1,0,0,0,0,0, 0,1,0,0,0,0, 0,0,1,0,0,0, 0,0,0,1,0,0, 0,0,0,0,1,0, 0,0,0,0,0,1}, int64[3] shape = {2, 2, 3}, float[2] s = {2, -0.5}, float[2] b = {1, 0.5}, float[2] m = {0.5, 0}, float[2] v = {3, 0.25}>
{
  h = MatMul (x, w)
  t = Reshape (h, shape)
  y = BatchNormalization (t, s, b, m, v)
}
""",
    "refuse_param_dims": """<ir_version: 8, opset_import: ["" : 15]>
g (float[1,2,3,3] x) => (float[1,2,3,3] y)
<float[2,1,1,1] w = {1, 2}, float[2] s = {2, -0.5}, float[2] b = {1, 0.5}, float[2,1] m = {0.5, 0}, float[2] v = {3, 0.25}>
{
  h = Conv (x, w)
  y = BatchNormalization (h, s, b, m, v)
}
""",
    "refuse_mul_broadcast": """<ir_version: 8, opset_import: ["" : 15]>
g (float[1,1,3,3] x) => (float[1,2,3,3] y)
<float[2,2,1,1] w = {1, 2, 3, 4}, float[1,2,1,1] k = {2, 3}>
{
  z = Mul (x, k)
  y = Conv (z, w)
}
""",
    "refuse_bias_dims": """<ir_version: 8, opset_import: ["" : 15]>
g (float[2,2] x) => (float[2,2] y)
<float[2,2] w = {1, 2, 3, 4}, float[2,2] c = {1, 2, 3, 4}, float[2] k = {0.5, 1}>
{
  h = Gemm (x, w, c)
  y = Add (h, k)
}
""",
    "refuse_constant_reshape": """<ir_version: 8, opset_import: ["" : 15]>
g (float[1,2,3,3] x) => (float[1,2,3,3] y)
<float[2,1,1,1] w = {1, 2}, float[2] s = {2, -0.5}, float[2] b = {1, 0.5}, float[2] m = {0.5, 0}, float[4] v4 = {3, 0.25, 1, 1}, int64[1] two = {2}>
{
  h = Conv (x, w)
  v = Reshape (v4, two)
  y = BatchNormalization (h, s, b, m, v)
}
""",
    # Constants a rule would merge but may not: kept by --keep (the "keep" run), or of another type than the layer.
    "kept_constants": """<ir_version: 8, opset_import: ["" : 15]>
g (float[1,2,3,3] x) => (float[1,2,3,3] y, float[1,2,3,3] z)
<float[2,2,1,1] w = {1, 2, 3, 4}, float[2,2,1,1] w2 = {1, 0, 2, 1}>
{
  kept_bias = Constant <value = float[1,2,1,1] {0.5, -1}> ()
  kept_scale = Constant <value = float[1,2,1,1] {2, 3}> ()
  kept_input_scale = Constant <value = float[1,2,1,1] {1.5, 0.5}> ()
  h = Conv (x, w)
  y = Add (h, kept_bias)
  s = Mul (x, kept_input_scale)
  c = Conv (s, w2)
  z = Mul (c, kept_scale)
}
""",
    "constant_of_other_type": """<ir_version: 8, opset_import: ["" : 15]>
g (float[1,2,3,3] x) => (float[1,2,3,3] y, float[1,2,3,3] z)
<float[2,2,1,1] w = {1, 2, 3, 4}, float[2,2,1,1] w2 = {1, 0, 2, 1}, double[1,2,1,1] k = {0.5, -1}, double[1,2,1,1] f = {2, 3}>
{
  h = Conv (x, w)
  y = Add (h, k)
  s = Mul (x, f)
  c = Conv (s, w2)
  z = Mul (c, f)
}
""",
}


def bad_tensor_model():
    """A weight whose data does not fill its dims: loading refuses it with a message naming the dims."""
    model = onnx.parser.parse_model(MODELS["fold_gemm_opset6"])
    for tensor in model.graph.initializer:
        if tensor.name == "w":
            del tensor.float_data[:]
            tensor.float_data.extend([1.0, 2.0, 3.0])
            tensor.data_type = TensorProto.FLOAT
    return model


def huge_dims_model():
    """A weight whose dims multiply past 64 bits: loading refuses it with a message naming the dims."""
    model = onnx.parser.parse_model(MODELS["fold_gemm_opset6"])
    for tensor in model.graph.initializer:
        if tensor.name == "w":
            del tensor.float_data[:]
            del tensor.dims[:]
            tensor.dims.extend([1 << 32, 1 << 32, 1 << 32])
    return model


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out_dir", type=pathlib.Path, help="directory to write the models into")
    out_dir = parser.parse_args().out_dir
    out_dir.mkdir(parents=True, exist_ok=True)
    for name, text in MODELS.items():
        onnx.save(onnx.parser.parse_model(text), str(out_dir / f"{name}.onnx"))
    onnx.save(bad_tensor_model(), str(out_dir / "bad_tensor_dims.onnx"))
    onnx.save(huge_dims_model(), str(out_dir / "huge_tensor_dims.onnx"))


if __name__ == "__main__":
    main()
