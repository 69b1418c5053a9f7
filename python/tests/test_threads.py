"""Threads fold at once, each getting what it would get alone, and the GIL is released while the library works."""

import concurrent.futures
import sys
import threading
import time

import onnx

import bnfold
from conftest import sample, without_paths

SAMPLES = ["resnet_block.onnx", "mlp_bn1d.onnx", "decoder_convtranspose.onnx", "bias_add.onnx",
           "unfoldable_bn.onnx", "training_bn.onnx"]


def test_threads_folding_at_once_get_what_each_gets_alone(tmp_path):
    models = [sample(name).read_bytes() for name in SAMPLES]
    alone = [bnfold.fold(model, verify=True) for model in models]
    jobs = [index % len(models) for index in range(48)]

    def work(index):
        kind = index % 3
        if kind == 0:
            return bnfold.fold(models[index % len(models)], verify=True)
        if kind == 1:
            return bnfold.fold(onnx.ModelProto.FromString(models[index % len(models)]), verify=True)
        out = tmp_path / f"out{index}.onnx"
        bnfold.fold(sample(SAMPLES[index % len(models)]), output=out, verify=True)
        return out.read_bytes(), None

    with concurrent.futures.ThreadPoolExecutor(max_workers=8) as pool:
        results = list(pool.map(work, range(len(jobs))))
    for index, (model, report) in enumerate(results):
        expected_model, expected_report = alone[index % len(models)]
        if isinstance(model, onnx.ModelProto):
            model = model.SerializeToString()
        assert onnx.ModelProto.FromString(model) == onnx.ModelProto.FromString(expected_model)
        if report is not None:
            assert without_paths(report) == without_paths(expected_report)


def test_the_gil_is_released_while_folding(resnet50_path):
    data = resnet50_path.read_bytes()
    finished = threading.Event()
    fold_seconds = []

    def fold_in_background():
        # A few folds with --verify (each about three plain folds), so that every one of them lasts many GIL switch
        # intervals on any machine, fast or loaded.
        for _ in range(3):
            start = time.perf_counter()
            bnfold.fold(data, verify=True)
            fold_seconds.append(time.perf_counter() - start)
        finished.set()

    thread = threading.Thread(target=fold_in_background)
    longest_pause = 0.0
    ticks = 0
    thread.start()
    last = time.perf_counter()
    while not finished.is_set():
        now = time.perf_counter()
        longest_pause = max(longest_pause, now - last)
        last = now
        ticks += 1
    thread.join()
    shortest_fold = min(fold_seconds)
    # The check means something only when a fold is long against the interval at which Python hands the GIL over.
    assert shortest_fold > 10 * sys.getswitchinterval(), fold_seconds
    # With the GIL held for a whole fold, this thread would stop for all of it.
    assert longest_pause < shortest_fold / 2, (longest_pause, fold_seconds, ticks)
