"""Shared helpers of the bnfold Python tests: models stated in ONNX text, the CLI, and the ONNX Runtime oracle
(scripts/ort/compare.js, the one the C++ tests use). CTest runs these with PYTHONPATH pointing at the build's
package (python/CMakeLists.txt); run by hand: PYTHONPATH=build/python /usr/bin/python3 -m pytest python/tests."""

import json
import os
import pathlib
import shutil
import subprocess

import pytest

SOURCE_DIR = pathlib.Path(os.environ.get("BNFOLD_SOURCE_DIR", pathlib.Path(__file__).resolve().parents[2]))
MODELS = SOURCE_DIR / "models"


def cli_executable():
    path = os.environ.get("BNFOLD_CLI") or shutil.which("bnfold") or str(SOURCE_DIR / "build" / "apps" / "bnfold")
    if not os.path.exists(path):
        pytest.fail(f"the bnfold CLI is not at {path}: build it or set BNFOLD_CLI")
    return path


def run_cli(*args):
    """(exit code, stdout, stderr) of `bnfold ARGS`."""
    done = subprocess.run([cli_executable(), *map(str, args)], capture_output=True, text=True)
    return done.returncode, done.stdout, done.stderr


def parse_model(text):
    """A ModelProto from ONNX text (onnx.parser), as the C++ tests state their models."""
    import onnx.parser

    return onnx.parser.parse_model(text)


def compare_in_ort(model_a, model_b, atol=1e-5, rtol=1e-4):
    """Runs both model files in ONNX Runtime on the same seeded inputs; returns compare.js's JSON result."""
    done = subprocess.run(
        ["node", str(SOURCE_DIR / "scripts" / "ort" / "compare.js"), str(model_a), str(model_b), "--json",
         "--atol", str(atol), "--rtol", str(rtol)],
        capture_output=True, text=True)
    try:
        result = json.loads(done.stdout)
    except json.JSONDecodeError:
        pytest.fail(f"compare.js exited {done.returncode}: {done.stderr}{done.stdout}")
    result["exit_code"] = done.returncode
    return result


def assert_same_in_ort(model_a, model_b, atol=1e-5, rtol=1e-4):
    result = compare_in_ort(model_a, model_b, atol, rtol)
    assert result["exit_code"] == 0 and result.get("ok") and not result.get("error"), result
    return result


def ops(model):
    return [node.op_type for node in model.graph.node]


def sample(name):
    return MODELS / name


def without_paths(report):
    """A report without the fields that name files, which differ between a file run and an in-memory run."""
    return {key: value for key, value in report.items() if key not in ("input", "output")}


# Conv (no bias) -> BN -> Relu, with a second BN after a Gemm head: three things to fold, each a known node name.
CONV_BN_TEXT = """
<ir_version: 8, opset_import: ["" : 13]>
conv_bn (float[1, 2, 4, 4] x) => (float[1, 3] y) <
    float[3, 2, 3, 3] w = {0.1, -0.2, 0.3, 0.05, 0.4, -0.1, 0.2, 0.2, -0.3, 0.1, 0.0, 0.5, -0.4, 0.3, 0.1, 0.2, -0.2, 0.1,
                           0.3, 0.1, -0.1, 0.2, 0.2, 0.0, -0.5, 0.1, 0.4, 0.2, 0.3, -0.2, 0.1, 0.1, 0.2, -0.1, 0.3, 0.4,
                           -0.3, 0.2, 0.1, 0.0, 0.1, 0.2, 0.3, -0.2, 0.1, 0.2, -0.1, 0.3, 0.2, 0.1, 0.0, -0.2, 0.4, 0.1},
    float[3] s = {1.5, -0.5, 2.0}, float[3] b = {0.1, 0.2, -0.3}, float[3] m = {0.05, -0.1, 0.2},
    float[3] v = {0.5, 1.5, 2.5},
    float[3, 3] gw = {0.2, -0.1, 0.4, 0.3, 0.5, -0.2, 0.1, 0.1, 0.3}, float[3] gb = {0.0, 0.1, -0.1},
    float[3] s2 = {0.7, 1.2, -0.9}, float[3] b2 = {0.3, -0.2, 0.1}, float[3] m2 = {0.1, 0.0, -0.2},
    float[3] v2 = {1.1, 0.4, 0.9}
> {
    c = Conv <pads = [1, 1, 1, 1]> (x, w)
    n = BatchNormalization <epsilon = 0.001> (c, s, b, m, v)
    r = Relu (n)
    p = GlobalAveragePool (r)
    f = Flatten (p)
    g = Gemm <transB = 1> (f, gw, gb)
    y = BatchNormalization (g, s2, b2, m2, v2)
}
"""


# A real verification failure, no test hook (the C++ CLI test uses the same model): the Conv's bias 1e8 is cancelled
# by the BN's mean 1e8. In float the original's c + 1e8 keeps only multiples of 8, while the folded bias
# (B - mean) * k + beta is exactly 0, so the fold changes the model's numbers far beyond float's tolerance.
LOSSY_FOLD_TEXT = """
<ir_version: 8, opset_import: ["" : 13]>
g (float[1,2,4,4] x) => (float[1,2,4,4] y)
<float[2,2,1,1] w = {1, 0.5, -0.25, 2}, float[2] bias = {100000000, 100000000}, float[2] s = {1, 1},
 float[2] b = {0, 0}, float[2] m = {100000000, 100000000}, float[2] v = {1, 1}>
{
  c = Conv (x, w, bias)
  y = BatchNormalization (c, s, b, m, v)
}
"""


@pytest.fixture
def conv_bn_model():
    model = parse_model(CONV_BN_TEXT)
    # Name the nodes so that `keep` can select them.
    for index, node in enumerate(model.graph.node):
        node.name = f"{node.op_type.lower()}_{index}"
    return model


@pytest.fixture(scope="session")
def resnet50_path(tmp_path_factory):
    """ResNet-50 v1 with random weights (~98 MiB, 53 Conv+BN), from scripts/gen_resnet50.py; deleted afterwards."""
    path = tmp_path_factory.mktemp("resnet50") / "resnet50.onnx"
    subprocess.run(["/usr/bin/python3", str(SOURCE_DIR / "scripts" / "gen_resnet50.py"), str(path)], check=True,
                   capture_output=True)
    yield path
    shutil.rmtree(path.parent, ignore_errors=True)
