"""A model over protobuf's 2 GiB limit, in external data, folded path to path: the tensors are streamed file to
file (this process never holds them), the output keeps them external beside it and computes what the input
computes in ONNX Runtime. As test/io/test_large_model.cpp: about 4.5 GB of temporary disk, deleted afterwards;
under CTest the input is generated once for both tests (BNFOLD_LARGE_MODEL_INPUT names its folder)."""

import os
import pathlib
import resource
import shutil
import subprocess

import pytest

import bnfold
from conftest import SOURCE_DIR, assert_same_in_ort

TWO_GIB = 1 << 31
DISK_NEEDED = 4500 * 1000 * 1000
DISK_NEEDED_FOR_OUTPUT = 2300 * 1000 * 1000


def folder_bytes(folder):
    return sum(path.stat().st_size for path in folder.iterdir())


def peak_rss_bytes():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def test_a_model_over_2_gib_folds_from_path_to_path(tmp_path):
    given_input = os.environ.get("BNFOLD_LARGE_MODEL_INPUT")
    needed = DISK_NEEDED_FOR_OUTPUT if given_input else DISK_NEEDED
    if shutil.disk_usage(tmp_path).free < needed:
        pytest.fail(f"needs {needed // 10**6} MB free in {tmp_path}: free space or point TMPDIR elsewhere")
    try:
        inputs = pathlib.Path(given_input) if given_input else tmp_path / "in"
        outputs = tmp_path / "out"
        outputs.mkdir()
        if not given_input:
            subprocess.run(["/usr/bin/python3", str(SOURCE_DIR / "scripts" / "gen_large_model.py"), str(inputs)],
                           check=True, capture_output=True)
        assert folder_bytes(inputs) > TWO_GIB

        rss_before = peak_rss_bytes()
        result, report = bnfold.fold(inputs / "model.onnx", output=outputs / "model.onnx")
        assert result == str(outputs / "model.onnx")
        assert len(report["folds"]) == 4 and report["skipped"] == []
        # Streamed: the fold did not hold the model's 2 GiB in this process.
        assert peak_rss_bytes() - rss_before < TWO_GIB // 2

        assert (outputs / "model.onnx").stat().st_size < 1 << 20
        assert folder_bytes(outputs) > TWO_GIB
        info = bnfold.info(outputs / "model.onnx")
        assert info["batch_normalization"]["count"] == 0
        assert_same_in_ort(inputs / "model.onnx", outputs / "model.onnx", atol=1e-5, rtol=1e-4)
    finally:
        shutil.rmtree(tmp_path, ignore_errors=True)
