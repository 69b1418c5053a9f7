"""bnfold.check and bnfold.info answer what `bnfold check --format json` and `bnfold info --json` print."""

import json

import onnx
import pytest

import bnfold
from conftest import run_cli, sample

SAMPLES = ["resnet_block.onnx", "unfoldable_bn.onnx", "training_bn.onnx", "bias_add.onnx"]


def cli_findings(path, *flags):
    code, out, err = run_cli("check", path, "--format", "json", *flags)
    assert code in (0, 1), err
    return json.loads(out)["models"][0]["findings"]


def comparable(finding):
    return {key: value for key, value in finding.items() if value is not None}


@pytest.mark.parametrize("name", SAMPLES)
def test_check_findings_equal_the_cli(name):
    path = sample(name)
    for keywords, flags in [({}, []), ({"fail_on": "all"}, ["--fail-on", "all"]),
                            ({"fail_on": "none", "rules": "none"}, ["--fail-on", "none", "--rules", "none"])]:
        findings = bnfold.check(path, **keywords)
        assert [comparable(f) for f in findings] == cli_findings(path, *flags)
        assert all(set(f) >= {"category", "severity", "node", "message"} for f in findings)
        # The same model in memory gives the same findings.
        assert bnfold.check(onnx.load(path), **keywords) == findings


def test_check_severity_follows_fail_on():
    findings = bnfold.check(sample("resnet_block.onnx"))
    assert {f["category"] for f in findings} == {"foldable-bn"}
    assert all(f["severity"] == "error" for f in findings) and len(findings) == 3
    assert all(f["severity"] == "warning" for f in bnfold.check(sample("resnet_block.onnx"), fail_on="none"))
    assert all(f["severity"] == "error" for f in bnfold.check(sample("resnet_block.onnx"), fail_on=["foldable-bn"]))
    assert bnfold.check(sample("unfoldable_bn.onnx"), fail_on="none")
    assert "foldable-bn" in {name for name, _ in bnfold.finding_categories()}
    assert bnfold.DEFAULT_FAIL_ON == "foldable-bn,training-bn"


def test_a_folded_model_checks_clean(tmp_path):
    folded, _ = bnfold.fold(onnx.load(sample("resnet_block.onnx")))
    assert bnfold.check(folded) == []


@pytest.mark.parametrize("name", SAMPLES)
def test_info_equals_the_cli(name):
    code, out, err = run_cli("info", sample(name), "--json")
    assert code == 0, err
    assert bnfold.info(sample(name)) == json.loads(out)
    in_memory = bnfold.info(sample(name).read_bytes())
    assert in_memory["file"] == "<bytes>"
    assert {k: v for k, v in in_memory.items() if k != "file"} == {
        k: v for k, v in json.loads(out).items() if k != "file"}


def test_info_counts_batch_normalization():
    info = bnfold.info(onnx.load(sample("resnet_block.onnx")))
    assert info["batch_normalization"] == {"count": 3, "input_producers": {"Conv": 3}}
    assert info["opsets"] == {"ai.onnx": 13}
