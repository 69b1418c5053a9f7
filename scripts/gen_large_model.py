#!/usr/bin/python3
"""Write a "wide" ONNX model larger than 2 GiB, with its tensors in ONNX external data.

OUT_DIR/model.onnx holds the graph; OUT_DIR/model.onnx.data holds every float tensor. The graph is a few very wide
layers on a single sample, so the weights are huge but the compute is one matrix-vector product per layer and
ONNX Runtime runs it in seconds:

    input [1, D] -> Gemm(transB=1) -> BN -> Relu -> Reshape [1, D, 1, 1]
                 -> Conv 1x1 (on 1x1 spatial) -> BN -> Relu -> Conv 1x1 -> BN -> Relu -> Flatten
                 -> MatMul -> BN -> output [1, D]

D is chosen so the total tensor bytes exceed --size-gb GiB. Weights are streamed to the data file in row
chunks and each TensorProto gets its external_data location/offset/length directly, so generation needs a few
tens of MB of RAM, not the model size. Tensors start on 4096-byte boundaries so a loader can mmap them.

Uses Debian's python3-onnx (1.12) and python3-numpy, hence /usr/bin/python3.

Usage: scripts/gen_large_model.py OUT_DIR [--size-gb 2.1] [--seed S]
"""

import argparse
import math
import pathlib
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

MODEL_FILE = "model.onnx"
DATA_FILE = "model.onnx.data"
IR_VERSION = 8
OPSET = 13
GIB = 1 << 30
TENSOR_ALIGNMENT = 4096
CHUNK_BYTES = 16 << 20
LAYER_KINDS = ["gemm", "conv", "conv", "matmul"]


class ExternalDataWriter:
    """Appends tensors to one data file and returns TensorProtos that point into it."""

    def __init__(self, data_path):
        self.file = open(data_path, "wb")
        self.location = data_path.name
        self.offset = 0

    def close(self):
        self.file.close()

    def _tensor_proto(self, name, shape, offset, length):
        tensor = TensorProto()
        tensor.name = name
        tensor.data_type = TensorProto.FLOAT
        tensor.dims.extend(shape)
        tensor.data_location = TensorProto.EXTERNAL
        for key, value in (("location", self.location), ("offset", offset), ("length", length)):
            entry = tensor.external_data.add()
            entry.key = key
            entry.value = str(value)
        return tensor

    def _align(self):
        padding = -self.offset % TENSOR_ALIGNMENT
        if padding:
            self.file.write(b"\0" * padding)
            self.offset += padding

    def write_chunks(self, name, shape, chunks):
        """Write float32 arrays from the iterable `chunks` (C order, together exactly `shape`) as one tensor."""
        self._align()
        start = self.offset
        expected = 4 * math.prod(shape)
        for chunk in chunks:
            np.ascontiguousarray(chunk, dtype="<f4").tofile(self.file)
            self.offset += chunk.size * 4
        if self.offset - start != expected:
            raise RuntimeError(f"tensor {name}: wrote {self.offset - start} bytes, shape needs {expected}")
        return self._tensor_proto(name, shape, start, expected)

    def write_array(self, name, array):
        return self.write_chunks(name, list(array.shape), [array])


# Weights are cut from one pool of normals rather than drawn afresh: drawing 2 GiB of them was most of a test's
# time. The pool's length is prime, so no row starts at the same pool offset as the row above it.
POOL_FLOATS = 4_194_301


class WeightPool:
    def __init__(self, rng):
        pool = rng.standard_normal(POOL_FLOATS, dtype=np.float32)
        self.extended = np.concatenate([pool, pool[:CHUNK_BYTES // 4]])  # a chunk never wraps around
        self.offset = 0

    def take(self, count):
        if count > CHUNK_BYTES // 4:
            raise ValueError(f"a chunk of {count} floats is longer than the pool's overlap")
        start = self.offset
        self.offset = (self.offset + count) % POOL_FLOATS
        return self.extended[start:start + count]


def he_weight_chunks(pool, rows, columns, fan_in):
    """A [rows, columns] He-initialized weight, a few rows at a time."""
    rows_per_chunk = max(1, CHUNK_BYTES // (4 * columns))
    scale = np.float32(math.sqrt(2.0 / fan_in))
    for first in range(0, rows, rows_per_chunk):
        chunk_rows = min(rows_per_chunk, rows - first)
        yield (pool.take(chunk_rows * columns) * scale).reshape(chunk_rows, columns)


def width_for(size_bytes, layers):
    """Smallest multiple of 64 whose `layers` square float32 weights alone exceed size_bytes."""
    width = math.isqrt(size_bytes // (4 * layers)) + 1
    return -(-width // 64) * 64


def build(out_dir, size_gib, seed):
    rng = np.random.default_rng(seed)
    pool = WeightPool(rng)
    width = width_for(int(size_gib * GIB), len(LAYER_KINDS))
    nodes, initializers = [], []
    writer = ExternalDataWriter(out_dir / DATA_FILE)
    try:
        x, rank = "input", 2
        for index, kind in enumerate(LAYER_KINDS):
            prefix = f"layer{index}"
            is_last = index == len(LAYER_KINDS) - 1
            if kind == "conv" and rank == 2:
                # 32 bytes: kept inline in the model, so the file mixes inline and external tensors.
                initializers.append(numpy_helper.from_array(np.array([1, width, 1, 1], dtype=np.int64),
                                                            "to_4d.shape"))
                nodes.append(helper.make_node("Reshape", [x, "to_4d.shape"], ["to_4d_out"], name="to_4d",
                                              doc_string="[1, D] -> [1, D, 1, 1] so 1x1 convs see a 1x1 image"))
                x, rank = "to_4d_out", 4
            elif kind != "conv" and rank == 4:
                nodes.append(helper.make_node("Flatten", [x], ["to_2d_out"], name="to_2d", axis=1))
                x, rank = "to_2d_out", 2

            weight_name = f"{prefix}.weight"
            if kind == "gemm":
                # [out, in] with transB=1, as PyTorch exports Linear.
                initializers.append(writer.write_chunks(weight_name, [width, width],
                                                        he_weight_chunks(pool, width, width, width)))
                initializers.append(writer.write_array(f"{prefix}.bias", rng.normal(0, 0.01, width).astype(np.float32)))
                nodes.append(helper.make_node("Gemm", [x, weight_name, f"{prefix}.bias"], [f"{prefix}_out"],
                                              name=f"{prefix}/gemm", transB=1))
            elif kind == "conv":
                initializers.append(writer.write_chunks(weight_name, [width, width, 1, 1],
                                                        he_weight_chunks(pool, width, width, width)))
                nodes.append(helper.make_node("Conv", [x, weight_name], [f"{prefix}_out"], name=f"{prefix}/conv",
                                              kernel_shape=[1, 1]))
            else:
                # MatMul weight is [in, out]; the shape is square so the He scale is the same.
                initializers.append(writer.write_chunks(weight_name, [width, width],
                                                        he_weight_chunks(pool, width, width, width)))
                nodes.append(helper.make_node("MatMul", [x, weight_name], [f"{prefix}_out"],
                                              name=f"{prefix}/matmul"))

            bn_params = {
                "weight": rng.uniform(0.5, 1.5, width),
                "bias": rng.normal(0.0, 0.1, width),
                "running_mean": rng.normal(0.0, 0.1, width),
                "running_var": rng.uniform(0.5, 2.0, width),
            }
            bn_inputs = [f"{prefix}_out"]
            for field, values in bn_params.items():
                initializers.append(writer.write_array(f"{prefix}.bn.{field}", values.astype(np.float32)))
                bn_inputs.append(f"{prefix}.bn.{field}")
            bn_out = "output" if is_last else f"{prefix}_bn_out"
            nodes.append(helper.make_node("BatchNormalization", bn_inputs, [bn_out], name=f"{prefix}/bn",
                                          doc_string="inference-mode BN on a huge layer: foldable"))
            x = bn_out
            if not is_last:
                nodes.append(helper.make_node("Relu", [x], [f"{prefix}_relu_out"], name=f"{prefix}/relu"))
                x = f"{prefix}_relu_out"
        data_bytes = writer.offset
    finally:
        writer.close()

    graph = helper.make_graph(
        nodes, "wide_model",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, width])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, [1, width])],
        initializers,
        doc_string=f"{len(LAYER_KINDS)} layers of width {width}; float tensors in {DATA_FILE}")
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                              producer_name="bnfold-large-model-generator", producer_version="1",
                              doc_string="Model over 2 GiB with external data, cheap to run")
    model.ir_version = IR_VERSION
    helper.set_model_props(model, {"generator": "scripts/gen_large_model.py", "seed": str(seed),
                                   "width": str(width)})
    (out_dir / MODEL_FILE).write_bytes(model.SerializeToString())
    return model, width, data_bytes


def main():
    parser = argparse.ArgumentParser(description="Write a >2 GiB wide ONNX model with external data.")
    parser.add_argument("out_dir", type=pathlib.Path, metavar="OUT_DIR")
    parser.add_argument("--size-gb", type=float, default=2.1, help="minimum total tensor size in GiB (default 2.1)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if not args.size_gb > 0:
        parser.error("--size-gb must be positive")
    if args.seed < 0:
        parser.error("--seed must be non-negative")

    try:
        args.out_dir.mkdir(parents=True, exist_ok=True)
        model, width, data_bytes = build(args.out_dir, args.size_gb, args.seed)
    except OSError as error:
        sys.exit(f"gen_large_model: cannot write {error.filename or args.out_dir}: {error.strerror}")

    model_path = args.out_dir / MODEL_FILE
    # Checking by path resolves external locations against OUT_DIR and checks the data file is there.
    # Shape inference runs on the in-memory proto, which holds only references, so it stays cheap (the
    # path form, infer_shapes_path, would rewrite model.onnx in place).
    onnx.checker.check_model(str(model_path))
    onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True)
    print(f"{model_path}  {model_path.stat().st_size} bytes + {args.out_dir / DATA_FILE}  {data_bytes} bytes "
          f"({data_bytes / GIB:.3f} GiB, width {width})")


if __name__ == "__main__":
    main()
