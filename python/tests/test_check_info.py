"""bnfold.check and bnfold.info answer what `bnfold check --format json` and `bnfold info --json` print."""

import json

import onnx
import onnx.parser
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


def hard_swish_model():
    """Conv -> BN (gamma 100 on channel 0) -> HardSwish -> Conv: folding leaves the first Conv's int8 weights far
    worse per tensor than per channel, and equalize cannot pass a scale through HardSwish."""
    channels = 16
    w1 = [v for c in range(channels) for v in (0.61 + 0.023 * c, -0.37 + 0.011 * c)]
    gamma = [100.0] + [1.0] * (channels - 1)
    w2 = [0.5 + 0.03 * ((o * 7 + i * 3) % 11) for o in range(4) for i in range(channels)]
    text = f"""
    <ir_version: 8, opset_import: ["" : 14]>
    m (float[1,2,4,4] x) => (float[1,4,4,4] y)
    <float[{channels},2,1,1] w1 = {{{", ".join(map(str, w1))}}}, float[{channels}] s = {{{", ".join(map(str, gamma))}}},
     float[{channels}] b = {{{", ".join(["0.1"] * channels)}}}, float[{channels}] m = {{{", ".join(["0"] * channels)}}},
     float[{channels}] v = {{{", ".join(["1"] * channels)}}}, float[4,{channels},1,1] w2 = {{{", ".join(map(str, w2))}}}>
    {{
      c1 = Conv <kernel_shape = [1, 1]> (x, w1)
      n1 = BatchNormalization (c1, s, b, m, v)
      a1 = HardSwish(n1)
      y = Conv <kernel_shape = [1, 1]> (a1, w2)
    }}
    """
    return onnx.parser.parse_model(text)


def test_info_weights_equals_the_cli(tmp_path):
    path = tmp_path / "hs.onnx"
    onnx.save(hard_swish_model(), str(path))
    code, out, err = run_cli("info", path, "--weights", "--json")
    assert code == 0, err
    info = bnfold.info(path, weights=True)
    assert info == json.loads(out)
    left_off = info["weights"]["left_off"]
    assert [(layer["node"], layer["reason"]) for layer in left_off] == [("Conv_0", "non-homogeneous-activation")]
    assert left_off[0]["gap_db"] > info["weights"]["gap_limit_db"]
    rows = {row["node"]: row for row in info["weights"]["layers"]}
    assert rows["Conv_0"]["loaded"]["gap_db"] < 10 < rows["Conv_0"]["folded"]["gap_db"]
    # --keep reaches the in-memory fold: the BN is not folded into the kept Conv.
    assert bnfold.info(path, weights=True, keep=["Conv_0"])["weights"]["left_off"] == []
    assert "weights" not in bnfold.info(path)
    with pytest.raises(bnfold.OptionError):
        bnfold.info(path, keep=["Conv_0"])
