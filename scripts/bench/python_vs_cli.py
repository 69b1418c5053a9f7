#!/usr/bin/python3
"""Benchmark of the Python module (issue 41): folding ResNet-50 with bnfold.fold from an onnx.ModelProto against
`bnfold fold` on the same file, side by side. Target: the module takes at most 1.5x the CLI's time.

Runs are interleaved (CLI, ModelProto, bytes, path, CLI, ...) so that load from other processes falls on all of
them alike; prints the median, min and max wall time of each and the ratio of the medians to the CLI's.
  cli         `bnfold fold IN -o OUT`: the whole process (start, load, rules, save)
  modelproto  bnfold.fold(model) in this process: ModelProto -> bytes -> fold -> bytes -> ModelProto
  bytes       bnfold.fold(data): serialized model in and out, no ModelProto
  path        bnfold.fold(IN, output=OUT): file to file, as the CLI, without a process start

Usage: scripts/bench/python_vs_cli.py [--build-dir build] [--runs 15] [--out-dir DIR] [--model FILE]
(the module is imported from BUILD_DIR/python unless an installed bnfold is wanted: --installed).
"""

import argparse
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parents[2]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build-dir", default=str(REPO / "build"))
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--out-dir", help="where the model and outputs go (default: a temporary folder)")
    parser.add_argument("--model", help="a model file to use instead of a generated ResNet-50")
    parser.add_argument("--installed", action="store_true", help="import the installed bnfold, not the build's")
    args = parser.parse_args()

    if not args.installed:
        sys.path.insert(0, str(pathlib.Path(args.build_dir) / "python"))
    import bnfold
    import onnx

    cli = pathlib.Path(args.build_dir) / "apps" / "bnfold"
    with tempfile.TemporaryDirectory(dir=args.out_dir) as scratch:
        scratch = pathlib.Path(scratch)
        model_path = pathlib.Path(args.model) if args.model else scratch / "resnet50.onnx"
        if not args.model:
            subprocess.run([sys.executable, str(REPO / "scripts" / "gen_resnet50.py"), str(model_path)], check=True,
                           capture_output=True)
        model = onnx.load(model_path)
        data = model_path.read_bytes()
        print(f"model: {model_path.name}, {len(data) / 1e6:.1f} MB; bnfold {bnfold.__version__} from "
              f"{pathlib.Path(bnfold.__file__).parent}")

        def run_cli():
            subprocess.run([str(cli), "fold", str(model_path), "-o", str(scratch / "cli.onnx")], check=True)

        def run_modelproto():
            folded, _ = bnfold.fold(model)
            assert isinstance(folded, onnx.ModelProto)

        def run_bytes():
            bnfold.fold(data)

        def run_path():
            bnfold.fold(model_path, output=scratch / "py.onnx")

        cases = {"cli": run_cli, "modelproto": run_modelproto, "bytes": run_bytes, "path": run_path}
        seconds = {name: [] for name in cases}
        for case in cases.values():  # warm-up: page cache, allocator
            case()
        for _ in range(args.runs):
            for name, case in cases.items():
                start = time.perf_counter()
                case()
                seconds[name].append(time.perf_counter() - start)

    cli_median = statistics.median(seconds["cli"])
    print(f"{'':12} {'median':>9} {'min':>9} {'max':>9} {'/ cli':>7}   ({args.runs} interleaved runs)")
    for name, times in seconds.items():
        median = statistics.median(times)
        print(f"{name:12} {median:8.3f}s {min(times):8.3f}s {max(times):8.3f}s {median / cli_median:6.2f}x")
    ratio = statistics.median(seconds["modelproto"]) / cli_median
    print(f"ModelProto / CLI: {ratio:.2f}x (target <= 1.5x): {'met' if ratio <= 1.5 else 'NOT met'}")
    return 0 if ratio <= 1.5 else 1


if __name__ == "__main__":
    sys.exit(main())
