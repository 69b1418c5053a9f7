"""Every option of `bnfold fold` as a keyword of bnfold.fold: each changes what it should, and gives the model and
report the CLI gives with the flag."""

import json
import pathlib
import sys
import warnings

import onnx
import pytest
from onnx import TensorProto, helper

import bnfold
from conftest import assert_same_in_ort, ops, run_cli, sample, without_paths


def with_params_as_inputs(model):
    """The model with every initializer also a graph input (IR >= 4: overridable defaults, as old PyTorch wrote)."""
    model = onnx.ModelProto.FromString(model.SerializeToString())
    for init in model.graph.initializer:
        model.graph.input.append(helper.make_tensor_value_info(init.name, init.data_type, list(init.dims)))
    return model


def with_variance_through_cast(model):
    """The first BN's variance computed by a Cast of a float64 initializer: a constant to evaluate."""
    model = onnx.ModelProto.FromString(model.SerializeToString())
    bn = next(node for node in model.graph.node if node.op_type == "BatchNormalization")
    variance = next(init for init in model.graph.initializer if init.name == bn.input[4])
    model.graph.initializer.append(helper.make_tensor("v_double", TensorProto.DOUBLE, list(variance.dims),
                                                      list(variance.float_data)))
    model.graph.node.insert(0, helper.make_node("Cast", ["v_double"], ["v_cast"], to=TensorProto.FLOAT, name="cast"))
    bn.input[4] = "v_cast"
    return model


# (keywords, the CLI flags that mean the same)
PARITY_CASES = [
    ({}, []),
    ({"rules": "none"}, ["--rules", "none"]),
    ({"rules": ["bn-fold", "bias-add"]}, ["--rules", "bn-fold,bias-add"]),
    ({"rules": "default,+bn-decompose"}, ["--rules", "default,+bn-decompose"]),
    ({"keep": "batchnormalization_1"}, ["--keep", "batchnormalization_1"]),
    ({"keep": ["conv_*", "gemm_*"]}, ["--keep", "conv_*", "--keep", "gemm_*"]),
    ({"keep_op": "Gemm"}, ["--keep-op", "Gemm"]),
    ({"verify": True}, ["--verify"]),
    ({"equalize": True}, ["--equalize"]),
    ({"equalize": True, "verify": True}, ["--equalize", "--verify"]),
    ({"equalize": True, "absorb_high_bias": True}, ["--equalize", "--absorb-high-bias"]),
    ({"equalize": True, "relu6_to_relu": True}, ["--equalize", "--relu6-to-relu"]),
    ({"max_constant_size": 0}, ["--max-constant-size", "0"]),
]


@pytest.mark.parametrize("keywords,flags", PARITY_CASES,
                         ids=[" ".join(flags) or "defaults" for _, flags in PARITY_CASES])
def test_keyword_gives_what_the_cli_flag_gives(keywords, flags, conv_bn_model, tmp_path):
    model = with_variance_through_cast(conv_bn_model)
    onnx.save(model, tmp_path / "in.onnx")
    folded, report = bnfold.fold(model, **keywords)
    code, _, err = run_cli("fold", tmp_path / "in.onnx", "-o", tmp_path / "cli.onnx", "--report",
                           tmp_path / "cli.json", *flags)
    assert code == 0, err
    assert folded == onnx.load(tmp_path / "cli.onnx")
    assert without_paths(report) == without_paths(json.loads((tmp_path / "cli.json").read_text()))
    onnx.save(folded, tmp_path / "py.onnx")
    assert_same_in_ort(tmp_path / "in.onnx", tmp_path / "py.onnx")


def skipped_reasons(report):
    return {entry["node"]: entry["reason"] for entry in report["skipped"]}


def test_rules(conv_bn_model):
    folded, report = bnfold.fold(conv_bn_model, rules="none")
    assert folded == conv_bn_model and report["folds"] == [] and report["rules"] == []
    _, report = bnfold.fold(conv_bn_model, rules=["bn-fold"])
    assert report["rules"] == ["bn-fold"] and len(report["folds"]) == 2
    assert {name for name, _, _ in bnfold.rules()} >= {"bn-fold", "bias-add"}


def test_keep_and_keep_op(conv_bn_model):
    folded, report = bnfold.fold(conv_bn_model, keep=["batchnormalization_1"])
    assert skipped_reasons(report) == {"batchnormalization_1": "kept-by-user"}
    assert ops(folded).count("BatchNormalization") == 1

    folded, report = bnfold.fold(conv_bn_model, keep_op="Gemm")
    assert skipped_reasons(report) == {"batchnormalization_6": "layer-kept-by-user"}
    assert [entry["bn"] for entry in report["folds"]] == ["batchnormalization_1"]


def test_input_defaults_are_constant(conv_bn_model, tmp_path):
    model = with_params_as_inputs(conv_bn_model)
    with pytest.warns(bnfold.BnfoldWarning, match="input-defaults-are-constant"):
        folded, report = bnfold.fold(model)
    assert report["folds"] == [] and len(report["skipped"]) == 2
    assert all("would_fold_with" in entry for entry in report["skipped"])

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        folded, report = bnfold.fold(model, input_defaults_are_constant=True)
    assert len(report["folds"]) == 2 and "BatchNormalization" not in ops(folded)
    onnx.save(model, tmp_path / "in.onnx")
    code, _, err = run_cli("fold", tmp_path / "in.onnx", "-o", tmp_path / "cli.onnx", "--input-defaults-are-constant")
    assert code == 0, err
    assert folded == onnx.load(tmp_path / "cli.onnx")


def test_freeze_train_bn(tmp_path):
    model = onnx.load(sample("training_bn.onnx"))
    _, default_report = bnfold.fold(model)
    assert default_report["frozen"] == []
    folded, report = bnfold.fold(model, freeze_train_bn=True)
    assert len(report["frozen"]) == 1
    code, _, err = run_cli("fold", sample("training_bn.onnx"), "-o", tmp_path / "cli.onnx", "--report",
                           tmp_path / "cli.json", "--freeze-train-bn")
    assert code == 0, err
    assert folded == onnx.load(tmp_path / "cli.onnx")
    assert without_paths(report) == without_paths(json.loads((tmp_path / "cli.json").read_text()))


def test_max_constant_size(conv_bn_model):
    model = with_variance_through_cast(conv_bn_model)
    _, report = bnfold.fold(model)
    assert len(report["evaluated"]) == 1 and len(report["folds"]) == 2
    _, report = bnfold.fold(model, max_constant_size=0)
    assert skipped_reasons(report) == {"batchnormalization_1": "constant-too-large"}


def test_verify_adds_a_verdict_to_every_rewrite(conv_bn_model):
    _, report = bnfold.fold(conv_bn_model, verify=True)
    assert "verification" in report
    assert report["folds"] and all(entry["verify"]["passed"] for entry in report["folds"])
    assert report["verification"]["failed"] == 0 and report["verification"]["passed"] == len(report["folds"])
    _, plain = bnfold.fold(conv_bn_model)
    assert "verification" not in plain


def test_dry_run_writes_nothing(conv_bn_model, tmp_path):
    model, report = bnfold.fold(conv_bn_model, dry_run=True, output=tmp_path / "never.onnx")
    assert model is None and len(report["folds"]) == 2
    result, report = bnfold.fold(sample("resnet_block.onnx"), dry_run=True)
    assert result is None and len(report["folds"]) == 3
    result, _ = bnfold.fold(sample("resnet_block.onnx"), output=tmp_path / "never.onnx", dry_run=True)
    assert result is None
    assert list(tmp_path.iterdir()) == []


def test_in_place_with_backup(tmp_path):
    path = tmp_path / "model.onnx"
    original = sample("resnet_block.onnx").read_bytes()
    path.write_bytes(original)
    result, report = bnfold.fold(path, in_place=True, backup_suffix=".bak")
    assert result == str(path) and len(report["folds"]) == 3
    assert (tmp_path / "model.onnx.bak").read_bytes() == original
    assert "BatchNormalization" not in ops(onnx.load(path))
    assert_same_in_ort(tmp_path / "model.onnx.bak", path)

    # Nothing left to change: the file is left alone.
    before = path.stat().st_mtime_ns
    _, report = bnfold.fold(path, in_place=True)
    assert report["folds"] == [] and path.stat().st_mtime_ns == before


def test_report_file_for_in_memory_models(conv_bn_model, tmp_path):
    _, report = bnfold.fold(conv_bn_model, report=tmp_path / "report.json")
    assert json.loads((tmp_path / "report.json").read_text()) == report
    code, _, err = run_cli("fold", sample("resnet_block.onnx"), "-o", tmp_path / "out.onnx", "--report",
                           tmp_path / "cli.json")
    assert code == 0, err
    # The same schema as the CLI's report, checked by the project's validator.
    import subprocess
    from conftest import SOURCE_DIR
    validated = subprocess.run([sys.executable, str(SOURCE_DIR / "scripts" / "validate_report.py"),
                                str(tmp_path / "report.json")], capture_output=True, text=True)
    assert validated.returncode == 0, validated.stderr + validated.stdout


def test_timings_print_the_cli_line(tmp_path, capfd):
    bnfold.fold(sample("resnet_block.onnx"), output=tmp_path / "out.onnx", timings=True)
    err = capfd.readouterr().err
    assert err.startswith("bnfold: timings: load ") and " total " in err


def test_base_dir_finds_external_data_of_an_in_memory_model(tmp_path):
    model = onnx.load(sample("resnet_block.onnx"))
    onnx.save(model, str(tmp_path / "ext.onnx"), save_as_external_data=True, all_tensors_to_one_file=True,
              location="ext.onnx.data", size_threshold=0)
    in_memory = onnx.load(str(tmp_path / "ext.onnx"), load_external_data=False)
    folded, report = bnfold.fold(in_memory, base_dir=tmp_path)
    assert len(report["folds"]) == 3
    with pytest.raises(bnfold.Error):
        bnfold.fold(in_memory, base_dir=tmp_path / "elsewhere")


# Options only for many models at once (keywords of fold_many), and only for one (keywords of fold).
BATCH_ONLY_FLAGS = {"--out-dir", "--report-dir", "--jobs"}
SINGLE_ONLY_FLAGS = {"--output", "--report"}


def keyword_only(function):
    import inspect

    return {name for name, parameter in inspect.signature(function).parameters.items()
            if parameter.kind is inspect.Parameter.KEYWORD_ONLY}


def stub_keywords(name):
    import ast

    stub = ast.parse((pathlib.Path(bnfold.__file__).parent / "__init__.pyi").read_text())
    overloads = [node for node in stub.body if isinstance(node, ast.FunctionDef) and node.name == name]
    assert overloads
    return [{arg.arg for arg in node.args.kwonlyargs} for node in overloads]


def test_every_cli_fold_option_is_a_keyword_of_fold_or_fold_many_and_of_their_stubs():
    import re

    code, out, _ = run_cli("fold", "--help")
    assert code == 0
    flags = set(re.findall(r"^  (?:-\w,)?(--[a-z0-9-]+)", out, re.MULTILINE)) - {"--help", "--help-all"}
    assert {"--rules", "--verify", "--output", "--out-dir", "--jobs"} <= flags
    as_keywords = lambda chosen: {flag[2:].replace("-", "_") for flag in chosen}
    assert as_keywords(flags - BATCH_ONLY_FLAGS) <= keyword_only(bnfold.fold)
    assert as_keywords(flags - SINGLE_ONLY_FLAGS) <= keyword_only(bnfold.fold_many)
    assert all(keywords == keyword_only(bnfold.fold) for keywords in stub_keywords("fold"))
    assert stub_keywords("fold_many") == [keyword_only(bnfold.fold_many)]
