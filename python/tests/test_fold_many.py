"""bnfold.fold_many: `bnfold fold IN... --out-dir DIR | --in-place` from Python. The same models, files and reports
as the CLI's batch run, one result per model, and a model that fails is a result, not an exception."""

import json
import os
import shutil

import onnx
import pytest

import bnfold
from conftest import LOSSY_FOLD_TEXT, assert_same_in_ort, ops, parse_model, run_cli, sample, without_paths


@pytest.fixture
def model_tree(tmp_path):
    """models/a.onnx, models/sub/b.onnx and models/sub/notes.txt, plus a file given apart: extra.onnx."""
    tree = tmp_path / "models"
    (tree / "sub").mkdir(parents=True)
    shutil.copy(sample("resnet_block.onnx"), tree / "a.onnx")
    shutil.copy(sample("mlp_bn1d.onnx"), tree / "sub" / "b.onnx")
    (tree / "sub" / "notes.txt").write_text("not a model")
    shutil.copy(sample("bias_add.onnx"), tmp_path / "extra.onnx")
    return tmp_path


def test_out_dir_writes_what_the_cli_writes(model_tree):
    inputs = [model_tree / "models", model_tree / "extra.onnx"]
    code, _, err = run_cli("fold", *inputs, "--out-dir", model_tree / "cli", "--jobs", "2")
    assert code == 0, err

    results = bnfold.fold_many(inputs, out_dir=model_tree / "py", jobs=2)

    relative = ["a.onnx", "sub/b.onnx", "extra.onnx"]
    assert [result.input for result in results] == [str(model_tree / "models" / "a.onnx"),
                                                     str(model_tree / "models" / "sub" / "b.onnx"),
                                                     str(model_tree / "extra.onnx")]
    assert all(result.ok and result.status == "ok" and result.error is None for result in results)
    for name, result in zip(relative, results):
        assert result.output == str(model_tree / "py" / name)
        report_name = name.replace(".onnx", ".report.json")
        assert result.report_path == str(model_tree / "py" / report_name)
        assert (model_tree / "py" / name).read_bytes() == (model_tree / "cli" / name).read_bytes()
        cli_report = json.loads((model_tree / "cli" / report_name).read_text())
        assert without_paths(json.loads((model_tree / "py" / report_name).read_text())) == without_paths(cli_report)
        assert without_paths(result.report) == without_paths(cli_report)
    assert sorted(os.listdir(model_tree / "py" / "sub")) == ["b.onnx", "b.report.json"]
    assert "BatchNormalization" not in ops(onnx.load(model_tree / "py" / "a.onnx"))
    assert len(results[0].report["folds"]) == 3
    assert_same_in_ort(model_tree / "models" / "a.onnx", model_tree / "py" / "a.onnx")


def test_a_single_folder_and_report_dir(model_tree):
    results = bnfold.fold_many(model_tree / "models", out_dir=model_tree / "out", report_dir=model_tree / "reports")
    assert [result.status for result in results] == ["ok", "ok"]
    assert sorted(os.listdir(model_tree / "reports")) == ["a.report.json", "sub"]
    assert results[1].report_path == str(model_tree / "reports" / "sub" / "b.report.json")
    assert json.loads((model_tree / "reports" / "sub" / "b.report.json").read_text())["folds"] == results[1].report["folds"]
    assert not (model_tree / "out" / "a.report.json").exists()


def test_one_bad_model_is_a_failed_result_with_the_cli_message_and_the_others_are_written(model_tree):
    (model_tree / "models" / "broken.onnx").write_bytes(b"\x08\x07\x12\xff\xff not a model")
    inputs = [model_tree / "models"]
    code, _, err = run_cli("fold", *inputs, "--out-dir", model_tree / "cli", "--jobs", "1")
    assert code == 2
    cli_failures = [line[len("failed: "):] for line in err.splitlines() if line.startswith("failed: ")]
    assert len(cli_failures) == 1

    results = bnfold.fold_many(inputs, out_dir=model_tree / "py")
    assert [result.status for result in results] == ["ok", "failed", "ok"]
    failed = results[1]
    assert not failed.ok
    assert isinstance(failed.error, bnfold.InvalidModelError)
    assert str(failed.error) == cli_failures[0]
    assert failed.report is None and failed.report_path is None
    assert not (model_tree / "py" / "broken.onnx").exists()
    assert (model_tree / "py" / "a.onnx").exists() and (model_tree / "py" / "sub" / "b.onnx").exists()


def test_a_rewrite_failing_verify_is_a_failed_result_with_its_report(tmp_path):
    (tmp_path / "in").mkdir()
    onnx.save(parse_model(LOSSY_FOLD_TEXT), tmp_path / "in" / "lossy.onnx")
    shutil.copy(sample("resnet_block.onnx"), tmp_path / "in" / "good.onnx")
    code, _, err = run_cli("fold", tmp_path / "in", "--out-dir", tmp_path / "cli", "--verify")
    assert code == 1
    cli_failures = [line[len("failed: "):] for line in err.splitlines() if line.startswith("failed: ")]

    good, lossy = bnfold.fold_many(tmp_path / "in", out_dir=tmp_path / "py", verify=True)
    assert good.status == "ok" and all(entry["verify"]["passed"] for entry in good.report["folds"])
    assert lossy.status == "failed"
    assert isinstance(lossy.error, bnfold.VerificationError)
    assert [str(lossy.error)] == cli_failures
    assert str(lossy.error).endswith("; no model written")
    assert lossy.error.report["verification"]["failed"] == 1 and lossy.report == lossy.error.report
    assert not (tmp_path / "py" / "lossy.onnx").exists()
    assert json.loads((tmp_path / "py" / "lossy.report.json").read_text())["verification"]["failed"] == 1


def test_in_place_with_backups_leaves_unchanged_models_alone(tmp_path):
    shutil.copy(sample("resnet_block.onnx"), tmp_path / "folds.onnx")
    shutil.copy(sample("unfoldable_bn.onnx"), tmp_path / "stays.onnx")
    originals = {name: (tmp_path / name).read_bytes() for name in ("folds.onnx", "stays.onnx")}
    assert bnfold.fold(sample("unfoldable_bn.onnx"), dry_run=True)[1]["folds"] == []

    folds, stays = bnfold.fold_many(tmp_path, in_place=True, backup_suffix=".bak")
    assert (folds.status, stays.status) == ("ok", "unchanged")
    assert folds.output == folds.input
    assert (tmp_path / "folds.onnx.bak").read_bytes() == originals["folds.onnx"]
    assert "BatchNormalization" not in ops(onnx.load(tmp_path / "folds.onnx"))
    assert (tmp_path / "stays.onnx").read_bytes() == originals["stays.onnx"]
    assert not (tmp_path / "stays.onnx.bak").exists()


def test_dry_run_writes_nothing(model_tree):
    before = sorted(str(path) for path in model_tree.rglob("*"))
    results = bnfold.fold_many([model_tree / "models", model_tree / "extra.onnx"], dry_run=True)
    assert [result.status for result in results] == ["dry-run"] * 3
    assert all(result.output is None and result.report_path is None for result in results)
    assert len(results[0].report["folds"]) == 3
    assert sorted(str(path) for path in model_tree.rglob("*")) == before


def test_bad_batches_raise_before_any_model_is_folded(model_tree, tmp_path):
    other = tmp_path / "other"
    other.mkdir()
    shutil.copy(sample("resnet_block.onnx"), other / "a.onnx")
    with pytest.raises(bnfold.Error, match="would both be written to"):
        bnfold.fold_many([model_tree / "models", other], out_dir=tmp_path / "out")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(bnfold.Error, match="no \\*.onnx file"):
        bnfold.fold_many(empty, out_dir=tmp_path / "out")
    assert not (tmp_path / "out").exists()
    with pytest.raises(bnfold.OptionError):
        bnfold.fold_many(model_tree / "models")
    with pytest.raises(bnfold.OptionError):
        bnfold.fold_many(model_tree / "models", out_dir=tmp_path / "out", in_place=True)
    with pytest.raises(bnfold.OptionError):
        bnfold.fold_many(model_tree / "models", out_dir=tmp_path / "out", backup_suffix=".bak")
    with pytest.raises(bnfold.OptionError):
        bnfold.fold_many(model_tree / "models", out_dir=tmp_path / "out", jobs=-1)
    with pytest.raises(bnfold.OptionError):
        bnfold.fold_many(model_tree / "models", out_dir=tmp_path / "out", rules="no-such-rule")
    with pytest.raises(bnfold.OptionError):
        bnfold.fold_many([], out_dir=tmp_path / "out")
    with pytest.raises(TypeError):
        bnfold.fold_many([42], out_dir=tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_rule_keywords_and_timings_apply_to_every_model(model_tree, capfd):
    results = bnfold.fold_many(model_tree / "models", out_dir=model_tree / "none", rules="none", timings=True)
    assert all(result.report["folds"] == [] and result.report["rules"] == [] for result in results)
    assert "BatchNormalization" in ops(onnx.load(model_tree / "none" / "a.onnx"))
    err = capfd.readouterr().err
    assert [line.split(": ")[2] for line in err.splitlines() if line.startswith("bnfold: timings: ")] == \
        [result.input for result in results]
    kept = bnfold.fold_many(model_tree / "models", dry_run=True, keep_op="Conv")
    assert all(entry["reason"] for entry in kept[0].report["skipped"]) and kept[0].report["folds"] == []
