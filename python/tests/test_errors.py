"""Bad input raises bnfold.Error (or a subclass) carrying the line the CLI prints, never changes the input and
leaves no partial output."""

import os

import onnx
import pytest

import bnfold
from conftest import LOSSY_FOLD_TEXT, parse_model, run_cli, sample


def cli_error_line(*args):
    code, _, err = run_cli(*args)
    assert code == 2
    prefix = "bnfold: error: "
    lines = [line for line in err.splitlines() if line.startswith(prefix)]
    assert len(lines) == 1, err
    return lines[0][len(prefix):]


def test_missing_file_is_an_invalid_model_with_the_cli_message(tmp_path):
    missing = tmp_path / "missing.onnx"
    with pytest.raises(bnfold.InvalidModelError) as raised:
        bnfold.fold(missing, output=tmp_path / "out.onnx")
    assert str(raised.value) == cli_error_line("fold", missing, "-o", tmp_path / "out.onnx")
    assert isinstance(raised.value, bnfold.Error)
    assert not (tmp_path / "out.onnx").exists()


def test_corrupt_file_and_bytes(tmp_path):
    corrupt = tmp_path / "corrupt.onnx"
    corrupt.write_bytes(b"\x08\x07\x12\xff\xff not a model")
    with pytest.raises(bnfold.InvalidModelError) as raised:
        bnfold.fold(corrupt, output=tmp_path / "out.onnx")
    assert str(raised.value) == cli_error_line("fold", corrupt, "-o", tmp_path / "out.onnx")
    assert corrupt.read_bytes() == b"\x08\x07\x12\xff\xff not a model"
    assert sorted(os.listdir(tmp_path)) == ["corrupt.onnx"]

    with pytest.raises(bnfold.InvalidModelError, match="^<bytes>: not a valid ONNX model"):
        bnfold.fold(corrupt.read_bytes())
    with pytest.raises(bnfold.InvalidModelError, match="empty"):
        bnfold.fold(b"")
    for function in (bnfold.check, bnfold.info):
        with pytest.raises(bnfold.InvalidModelError):
            function(corrupt)


def test_invalid_graph_in_a_model_proto(conv_bn_model):
    conv_bn_model.graph.node[0].input[0] = "undefined_value"
    with pytest.raises(bnfold.InvalidModelError, match="^<ModelProto>: .*undefined_value"):
        bnfold.fold(conv_bn_model)


def test_bad_keyword_values_are_option_errors_and_value_errors(conv_bn_model, tmp_path):
    with pytest.raises(bnfold.OptionError) as raised:
        bnfold.fold(conv_bn_model, rules="bn-fold,no-such-rule")
    assert isinstance(raised.value, ValueError)
    assert str(raised.value) == cli_error_line("fold", sample("resnet_block.onnx"), "-o", tmp_path / "o.onnx",
                                               "--rules", "bn-fold,no-such-rule")
    with pytest.raises(bnfold.OptionError, match="max-constant-size"):
        bnfold.fold(conv_bn_model, max_constant_size=-1)
    with pytest.raises(bnfold.OptionError, match="fail"):
        bnfold.check(conv_bn_model, fail_on="no-such-category")
    with pytest.raises(bnfold.OptionError, match="output="):
        bnfold.fold(sample("resnet_block.onnx"))
    with pytest.raises(bnfold.OptionError, match="in_place"):
        bnfold.fold(conv_bn_model, in_place=True)
    with pytest.raises(bnfold.OptionError, match="backup_suffix"):
        bnfold.fold(sample("resnet_block.onnx"), output=tmp_path / "o.onnx", backup_suffix=".bak")
    with pytest.raises(TypeError, match="ModelProto, bytes"):
        bnfold.fold(42)
    with pytest.raises(TypeError):
        bnfold.fold(conv_bn_model, keep=[1, 2])
    assert list(tmp_path.iterdir()) == []


def test_unwritable_outputs_fail_before_any_work_and_leave_the_input(tmp_path, conv_bn_model):
    source = tmp_path / "in.onnx"
    onnx.save(conv_bn_model, source)
    original = source.read_bytes()
    with pytest.raises(bnfold.Error) as raised:
        bnfold.fold(source, output=source)
    assert not isinstance(raised.value, bnfold.InvalidModelError)
    assert "overwrite the input" in str(raised.value)

    folder = tmp_path / "a_folder"
    folder.mkdir()
    with pytest.raises(bnfold.Error) as raised:
        bnfold.fold(source, output=folder)
    assert str(raised.value) == cli_error_line("fold", source, "-o", folder)
    with pytest.raises(bnfold.Error):
        bnfold.fold(conv_bn_model, output=folder)
    with pytest.raises(bnfold.Error):
        bnfold.fold(conv_bn_model, output=tmp_path / "no" / "such" / "folder.onnx")
    assert source.read_bytes() == original
    assert sorted(os.listdir(tmp_path)) == ["a_folder", "in.onnx"]
    assert list(folder.iterdir()) == []


def test_a_rewrite_that_fails_verify_raises_verification_error_and_writes_no_model(tmp_path):
    import json

    model = parse_model(LOSSY_FOLD_TEXT)
    source = tmp_path / "in.onnx"
    onnx.save(model, source)
    original = source.read_bytes()
    code, _, err = run_cli("fold", source, "-o", tmp_path / "cli.onnx", "--verify")
    assert code == 1 and not (tmp_path / "cli.onnx").exists()
    cli_lines = [line[len(f"bnfold: {source}: "):] for line in err.splitlines()
                 if line.startswith(f"bnfold: {source}: ")]
    assert len(cli_lines) == 2 and cli_lines[1] == "1 of 1 rewrites failed verification; no model written"

    # Without verify the same fold is written: the check is what refuses it.
    folded, _ = bnfold.fold(model)
    assert [node.op_type for node in folded.graph.node] == ["Conv"]

    for kind, given in (("path", source), ("ModelProto", model), ("bytes", original)):
        output, report_path = tmp_path / f"{kind}.onnx", tmp_path / f"{kind}.report.json"
        with pytest.raises(bnfold.VerificationError) as raised:
            bnfold.fold(given, output=output, report=report_path, verify=True)
        error = raised.value
        assert isinstance(error, bnfold.Error)
        name = str(source) if kind == "path" else f"<{kind}>"
        # The CLI's lines, with the model's name, joined: each failed rewrite, then the summary.
        assert str(error) == f"{name}: " + "; ".join(cli_lines)
        assert error.failures == cli_lines[:1]
        assert "bn-fold of BatchNormalization" in error.failures[0] and "failed verification" in error.failures[0]
        assert error.report["verification"]["failed"] == 1
        assert error.report["folds"][0]["verify"]["passed"] is False
        assert error.report["folds"][0]["verify"]["max_rel_error"] > error.report["folds"][0]["verify"]["tolerance"]
        assert not output.exists(), kind
        # The report says why, as the CLI's --report does.
        assert json.loads(report_path.read_text())["verification"]["failed"] == 1
    assert source.read_bytes() == original
    assert onnx.ModelProto.FromString(original) == model
