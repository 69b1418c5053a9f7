"""bnfold.fold on ModelProto, bytes and paths: the result has the input's kind, computes what the original computes
in ONNX Runtime, and matches what `bnfold fold` writes and reports."""

import json

import onnx
import pytest

import bnfold
from conftest import assert_same_in_ort, ops, run_cli, sample, without_paths


def test_model_proto_in_model_proto_out_folds_and_computes_the_same(conv_bn_model, tmp_path):
    original_bytes = conv_bn_model.SerializeToString()
    folded, report = bnfold.fold(conv_bn_model)

    assert isinstance(folded, onnx.ModelProto)
    assert conv_bn_model.SerializeToString() == original_bytes, "the argument must not change"
    assert "BatchNormalization" not in ops(folded)
    assert ops(folded) == ["Conv", "Relu", "GlobalAveragePool", "Flatten", "Gemm"]
    assert sorted(entry["bn"] for entry in report["folds"]) == ["batchnormalization_1", "batchnormalization_6"]
    assert report["input"] == "<ModelProto>"
    assert report["skipped"] == []
    onnx.checker.check_model(folded)

    onnx.save(conv_bn_model, tmp_path / "original.onnx")
    onnx.save(folded, tmp_path / "folded.onnx")
    assert_same_in_ort(tmp_path / "original.onnx", tmp_path / "folded.onnx")


def test_bytes_in_bytes_out(conv_bn_model, tmp_path):
    data = conv_bn_model.SerializeToString()
    folded, report = bnfold.fold(data)

    assert isinstance(folded, bytes)
    model = onnx.load_from_string(folded)
    assert "BatchNormalization" not in ops(model)
    assert len(report["folds"]) == 2
    assert report["input"] == "<bytes>"
    (tmp_path / "original.onnx").write_bytes(data)
    (tmp_path / "folded.onnx").write_bytes(folded)
    assert_same_in_ort(tmp_path / "original.onnx", tmp_path / "folded.onnx")

    # bytearray and memoryview are read as bytes.
    for view in (bytearray(data), memoryview(data)):
        again, _ = bnfold.fold(view)
        assert again == folded


def test_path_in_path_out_matches_the_cli(tmp_path):
    source = sample("resnet_block.onnx")
    original = source.read_bytes()
    result, report = bnfold.fold(str(source), output=tmp_path / "py.onnx", report=tmp_path / "py.json")

    assert result == str(tmp_path / "py.onnx")
    assert source.read_bytes() == original
    assert "BatchNormalization" not in ops(onnx.load(tmp_path / "py.onnx"))
    assert json.loads((tmp_path / "py.json").read_text()) == report
    assert report["input"] == str(source) and report["output"] == str(tmp_path / "py.onnx")

    code, _, err = run_cli("fold", source, "-o", tmp_path / "cli.onnx", "--report", tmp_path / "cli.json")
    assert code == 0, err
    assert (tmp_path / "py.onnx").read_bytes() == (tmp_path / "cli.onnx").read_bytes()
    assert without_paths(report) == without_paths(json.loads((tmp_path / "cli.json").read_text()))
    assert_same_in_ort(source, tmp_path / "py.onnx")


@pytest.mark.parametrize("name", ["resnet_block.onnx", "mlp_bn1d.onnx", "decoder_convtranspose.onnx",
                                  "bias_add.onnx", "unfoldable_bn.onnx"])
def test_in_memory_result_equals_the_cli_output(name, tmp_path):
    source = sample(name)
    folded, report = bnfold.fold(onnx.load(source))

    code, _, err = run_cli("fold", source, "-o", tmp_path / "cli.onnx", "--report", tmp_path / "cli.json")
    assert code == 0, err
    assert folded == onnx.load(tmp_path / "cli.onnx")
    assert without_paths(report) == without_paths(json.loads((tmp_path / "cli.json").read_text()))
    onnx.save(folded, tmp_path / "py.onnx")
    assert_same_in_ort(source, tmp_path / "py.onnx")


def test_pathlike_and_in_memory_output_file(conv_bn_model, tmp_path):
    onnx.save(conv_bn_model, tmp_path / "in.onnx")
    result, report = bnfold.fold(tmp_path / "in.onnx", output=tmp_path / "out.onnx")
    assert result == str(tmp_path / "out.onnx")
    assert len(report["folds"]) == 2

    # An in-memory model with output= is returned and also written, as `fold -o` writes it.
    folded, report = bnfold.fold(conv_bn_model, output=tmp_path / "also.onnx")
    assert onnx.load(tmp_path / "also.onnx") == folded
    assert report["output"] == str(tmp_path / "also.onnx")


def test_done_when_line_prints_the_fold_count():
    # The check: the sample's three Conv+BN pairs fold.
    _, report = bnfold.fold(onnx.load(str(sample("resnet_block.onnx"))))
    code, out, _ = run_cli("fold", sample("resnet_block.onnx"), "--dry-run")
    assert code == 0
    assert len(report["folds"]) == 3 and "3 BN folded" in out


def _layer_norm_chain_at_opset_14():
    from onnx import TensorProto, helper

    nodes = [
        helper.make_node("ReduceMean", ["x"], ["mean"], axes=[-1]),
        helper.make_node("Sub", ["x", "mean"], ["d"]),
        helper.make_node("Mul", ["d", "d"], ["sq"]),
        helper.make_node("ReduceMean", ["sq"], ["var"], axes=[-1]),
        helper.make_node("Add", ["var", "eps"], ["ve"]),
        helper.make_node("Sqrt", ["ve"], ["sd"]),
        helper.make_node("Div", ["d", "sd"], ["y"]),
    ]
    graph = helper.make_graph(nodes, "ln", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 6])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 6])],
                              [helper.make_tensor("eps", TensorProto.FLOAT, [], [1e-5])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])
    model.ir_version = 7
    return model


def test_target_opset_converts_first_and_reports_it(tmp_path):
    model = _layer_norm_chain_at_opset_14()
    converted, report = bnfold.fold(model, target_opset=17)
    assert [o.version for o in converted.opset_import if o.domain == ""] == [17]
    assert report["opset_converted"]["from"] == 14 and report["opset_converted"]["to"] == 17
    onnx.save(model, tmp_path / "original.onnx")
    onnx.save(converted, tmp_path / "converted.onnx")
    assert_same_in_ort(tmp_path / "original.onnx", tmp_path / "converted.onnx")

    path_result, path_report = bnfold.fold(str(tmp_path / "original.onnx"), output=str(tmp_path / "out.onnx"),
                                           target_opset=17)
    assert path_report["opset_converted"]["from"] == 14
    assert bnfold.check(model, target_opset=17) is not None

    with pytest.raises(bnfold.Error, match="up to 17"):
        bnfold.fold(model, target_opset=18)
    with pytest.raises(bnfold.Error, match="at opset 14 already"):
        bnfold.fold(model, target_opset=13)
    with pytest.raises(bnfold.OptionError):
        bnfold.fold(model, target_opset="17")


def test_a_model_proto_result_is_parsed_from_a_read_only_buffer_of_the_same_bytes():
    # fold(ModelProto) takes the folded model as a TransientBuffer (memory the module maps for the parse), not as
    # bytes; both must hold the same serialized model.
    from bnfold import _native
    data = sample("resnet_block.onnx").read_bytes()
    options = _native.driver_options(rules="default", keep=[], keep_op=[], input_defaults_are_constant=False,
                                     freeze_train_bn=False, equalize=False, absorb_high_bias=False,
                                     relu6_to_relu=False, max_constant_size=1024.0, verify=False)
    def fold_bytes(transient):
        return _native.fold_bytes(data=data, source_name="<bytes>", base_dir=".", output="", report="",
                                  options=options, dry_run=False, transient_model=transient)["model"]
    as_bytes, as_buffer = fold_bytes(False), fold_bytes(True)
    assert isinstance(as_bytes, bytes) and isinstance(as_buffer, _native.TransientBuffer)
    view = memoryview(as_buffer)
    assert view.readonly and len(as_buffer) == len(as_bytes) > 0
    assert view.tobytes() == as_bytes
    assert len(onnx.load_from_string(as_bytes).graph.node) < len(onnx.load_from_string(data).graph.node)
