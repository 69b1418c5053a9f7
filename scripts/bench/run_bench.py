#!/usr/bin/python3
"""bnfold benchmark: wall time and peak RSS of `bnfold fold` against the floor, `cp` and ONNX Runtime.

Usually run through scripts/bench/run_bench.sh, which builds the tools first. Generates the models (cached in
OUT_DIR/models, regenerated when a generator changes), then for each model runs every tool WARMUP + RUNS times,
round-robin so that load from other processes spreads over all tools alike, and reports per tool the median,
min and max wall time, the median CPU time (user + sys), and the peak RSS (ru_maxrss from wait4 on the child):

  bnfold fold          default rules (what the issue's targets are about)
  bnfold --rules none  load + save only: what the rules add is the difference
  floor                apps/tools/proto_roundtrip: protobuf parse + serialize, nothing else
  cp                   the model's file(s)
  ORT basic            scripts/bench/ort_optimize.js: ONNX Runtime session with graph optimisation `basic` and
                       optimizedModelFilePath; "process" is the whole node process, "create" the session
                       creation alone as measured inside the process (excludes node start-up)
  bnfold --verify      `fold --verify` with its report (issue 15); every run's report must say that each
                       rewrite was verified and passed, else the tool counts as failed
  ORT compare          scripts/bench/ort_compare.js: what scripts/ort/compare.js does to the original and
                       bnfold's folded model (two sessions, one run each, outputs compared); "process" is the
                       whole node process, "in-process" the comparison alone (excludes node start-up)

Then the rule-scaling measurement (N and 10N residual Conv+BN blocks; rule time = default - --rules none, or
bnfold's own phase timings when it has a --timings flag, plus the rules phase's instruction count under callgrind
when valgrind is installed) and a check of the targets of issues 7, 15 and 16.

Usage: scripts/bench/run_bench.py --build-dir DIR [--quick] [--runs N] [--out-dir DIR] [--models a,b]
                                  [--skip-large] [--no-ort] [--no-verify] [--scaling-blocks N] [--no-instructions]
                                  [--tools a,b] [--json FILE]
"""

import argparse
import json
import os
import pathlib
import platform
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parents[2]
SCRIPTS = REPO / "scripts"
MB = 1e6
GIB = 1 << 30
# Float32 folding changes weights by an ulp or so; through a deep network that stays well inside these.
VERIFY_ATOL, VERIFY_RTOL = 1e-5, 1e-4

TOOLS = ["bnfold", "bnfold-none", "floor", "cp", "ort", "bnfold-verify", "ort-compare"]
TOOL_LABELS = {"bnfold": "bnfold fold", "bnfold-none": "bnfold --rules none", "floor": "floor (protobuf)",
               "cp": "cp", "ort": "ORT basic (process)", "ort-create": "ORT basic (create)",
               "bnfold-verify": "bnfold fold --verify", "ort-compare": "ORT compare (process)",
               "ort-compare-in": "ORT compare (in-proc)"}
# Tools whose process prints a JSON line with the in-process time of the work itself (node start-up excluded):
# the key of that time, and the pseudo-tool the figures are kept under.
IN_PROCESS = {"ort": ("create_s", "ort-create"), "ort-compare": ("compare_s", "ort-compare-in")}


class Model:
    def __init__(self, name, generator, description, large=False, skip_tools=()):
        self.name = name
        self.generator = generator  # argv after the interpreter; "{out}" / "{dir}" are substituted
        self.description = description
        self.large = large
        self.skip_tools = set(skip_tools)  # tools not run on this model

    def folder(self, out_dir):
        return out_dir / "models" / self.name

    def path(self, out_dir):
        return self.folder(out_dir) / "model.onnx"


MODELS = [
    Model("resnet50", [SCRIPTS / "gen_resnet50.py", "{out}"], "ResNet-50 v1, 53 Conv+BN, final Gemm"),
    Model("mobilenetv2", [SCRIPTS / "bench/gen_mobilenetv2.py", "{out}"], "MobileNetV2, depthwise Conv+BN, Clip"),
    Model("mlp-gemm", [SCRIPTS / "bench/gen_mlp.py", "{out}", "--layer", "gemm"], "MLP 6 x Gemm+BN, width 2048"),
    Model("mlp-matmul", [SCRIPTS / "bench/gen_mlp.py", "{out}", "--layer", "matmul"],
          "MLP 6 x MatMul+BN, width 2048"),
    Model("decoder", [SCRIPTS / "bench/gen_decoder.py", "{out}"], "DCGAN decoder, 4 ConvTranspose+BN"),
    # Issue 16: tens of thousands of small nodes. ONNX Runtime takes about 10 s per session on it, so its two
    # tools are left out; the floor is what bnfold is measured against here.
    Model("graph-heavy", [SCRIPTS / "bench/gen_graph_heavy.py", "{out}"],
          "51,800 nodes: Conv+BN+Relu, Transpose, Reshape, MatMul+Add, SiLU, residual Add",
          skip_tools=("ort", "ort-compare")),
    Model("large", [SCRIPTS / "gen_large_model.py", "{dir}", "--size-gb", "{size_gb}"],
          "wide Gemm/Conv/MatMul+BN, external data", large=True),
]


def fail(message):
    sys.exit(f"run_bench: error: {message}")


def log(message):
    print(message, file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------------------------
# Machine and model files

def machine_description():
    cpu = "unknown"
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    ram_kb = 0
    try:
        for line in open("/proc/meminfo"):
            if line.startswith("MemTotal:"):
                ram_kb = int(line.split()[1])
    except OSError:
        pass
    return {"nproc": os.cpu_count(), "cpu": cpu, "ram_gib": round(ram_kb / (1 << 20), 1),
            "kernel": platform.release(), "python": platform.python_version(), "loadavg_start": os.getloadavg()}


def model_files(model_path):
    """The model file and the external data files it references (each once, in order)."""
    import onnx  # only needed here; keeps --help fast

    proto = onnx.load(str(model_path), load_external_data=False)
    files = [model_path]
    for tensor in proto.graph.initializer:
        for entry in tensor.external_data:
            if entry.key == "location":
                data = model_path.parent / entry.value
                if data not in files:
                    files.append(data)
    return files


def op_counts(model_path):
    import onnx

    proto = onnx.load(str(model_path), load_external_data=False)
    counts = {}
    for node in proto.graph.node:
        counts[node.op_type] = counts.get(node.op_type, 0) + 1
    return counts, proto


def generator_stamp(model, size_gb):
    """Changes when the generator's code or arguments change, so a cached model is regenerated."""
    script = pathlib.Path(model.generator[0])
    sources = [script, SCRIPTS / "bench/model_builder.py"]
    parts = [" ".join(str(a) for a in model.generator)] + ([f"size_gb={size_gb}"] if model.large else [])
    for source in sources:
        if source.exists():
            parts.append(f"{source.name}:{source.stat().st_size}:{int(source.stat().st_mtime)}")
    return "\n".join(parts) + "\n"


def generate(model, out_dir, size_gb):
    folder = model.folder(out_dir)
    stamp_file = folder / "generator.stamp"
    stamp = generator_stamp(model, size_gb)
    if model.path(out_dir).exists() and stamp_file.exists() and stamp_file.read_text() == stamp:
        return
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    argv = [sys.executable] + [str(a).format(out=model.path(out_dir), dir=folder, size_gb=size_gb)
                               for a in model.generator]
    log(f"generating {model.name}: {' '.join(argv[1:])}")
    result = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if result.returncode != 0:
        last_line = (result.stderr.strip().splitlines() or [f"exit {result.returncode}"])[-1]
        fail(f"generating {model.name} failed: {last_line}")
    stamp_file.write_text(stamp)


def free_bytes(path):
    return shutil.disk_usage(path).free


# ---------------------------------------------------------------------------------------------------------------
# Running and measuring one command

class Run:
    def __init__(self, wall, cpu, max_rss_kb, returncode, stdout, stderr):
        self.wall, self.cpu, self.max_rss_kb = wall, cpu, max_rss_kb
        self.returncode, self.stdout, self.stderr = returncode, stdout, stderr


MEASURE_SOURCE = SCRIPTS / "bench/measure.c"
measure_binary = None


def build_measure(out_dir):
    """Compiles scripts/bench/measure.c into OUT_DIR/bin (once per change of the source)."""
    global measure_binary
    binary = out_dir / "bin/measure"
    if not binary.exists() or binary.stat().st_mtime < MEASURE_SOURCE.stat().st_mtime:
        compiler = shutil.which("cc") or shutil.which("gcc")
        if compiler is None:
            fail("no C compiler (cc) on PATH to build scripts/bench/measure.c")
        binary.parent.mkdir(parents=True, exist_ok=True)
        result = subprocess.run([compiler, "-O2", "-o", binary, MEASURE_SOURCE], stderr=subprocess.PIPE, text=True)
        if result.returncode != 0:
            fail(f"cannot compile {MEASURE_SOURCE}: {result.stderr.strip()[:300]}")
    measure_binary = binary


def measure(argv):
    """Runs argv under measure.c: wall time, user+sys CPU and peak RSS of that command alone."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err, \
            tempfile.NamedTemporaryFile(mode="r", suffix=".measure") as result:
        launcher = subprocess.run([str(measure_binary), result.name] + [str(a) for a in argv], stdout=out, stderr=err)
        fields = result.read().split()
        if launcher.returncode != 0 or len(fields) != 5:
            err.seek(0)
            fail(f"measure failed on {' '.join(str(a) for a in argv)}: {err.read().decode(errors='replace')[-300:]}")
        out.seek(0)
        err.seek(0)
        wall, user, system, max_rss_kb, code = float(fields[0]), float(fields[1]), float(fields[2]), \
            int(fields[3]), int(fields[4])
        return Run(wall, user + system, max_rss_kb, code, out.read().decode(errors="replace"),
                   err.read().decode(errors="replace"))


def clear_folder(folder):
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)


class Tool:
    """One way of processing a model; argv(model_files, out_folder) -> command."""

    def __init__(self, key, argv):
        self.key = key
        self.argv = argv


def make_tools(args, model, files, folded):
    """The tools of args.tools that apply to the model; `folded` is bnfold's output, made beforehand, for the
    ORT comparison."""
    bnfold = args.build_dir / "apps/bnfold"
    floor = args.build_dir / "apps/bnfold_proto_roundtrip"
    ort_script = SCRIPTS / "bench/ort_optimize.js"
    tools = [
        # --timings costs three clock reads; its phases show what --verify adds to the rules phase.
        Tool("bnfold", lambda out: [bnfold, "fold", files[0], "-o", out / "model.onnx", "-q", "--timings"]),
        Tool("bnfold-none", lambda out: [bnfold, "fold", files[0], "-o", out / "model.onnx", "-q", "--rules", "none"]),
        Tool("floor", lambda out: [floor, files[0], out / "model.onnx"]),
        Tool("cp", lambda out: ["cp"] + files + [out]),
    ]
    if not args.no_ort:
        external = ["--external-data", "model.onnx.data"] if len(files) > 1 else []
        tools.append(Tool("ort", lambda out: ["node", ort_script, files[0], out / "model.onnx"] + external))
    if not model.large:
        # The >2 GB model's ORT comparison is the [large] test; --verify on it is left out with it.
        tools.append(Tool("bnfold-verify", lambda out: [bnfold, "fold", files[0], "-o", out / "model.onnx", "-q",
                                                        "--timings", "--verify", "--report", out / "report.json"]))
        if not args.no_ort:
            tools.append(Tool("ort-compare", lambda out: ["node", SCRIPTS / "bench/ort_compare.js", files[0], folded,
                                                          "--atol", str(VERIFY_ATOL), "--rtol", str(VERIFY_RTOL)]))
    return [tool for tool in tools if tool.key in args.tools and tool.key not in model.skip_tools]


def check_verification(report_path):
    """(summary, problem) of a `fold --verify` report: its "verification" object, and what is wrong when the
    report does not show every rewrite verified and passed (None when all is well)."""
    try:
        report = json.loads(report_path.read_text())
    except (OSError, ValueError) as error:
        return None, f"no readable report: {error}"
    summary = report.get("verification")
    if not isinstance(summary, dict) or not all(isinstance(summary.get(k), int) for k in ("rewrites", "passed",
                                                                                          "failed")):
        return None, "the report has no verification summary (rewrites, passed, failed)"
    # The verdict is on each rewrite's own entries (several entries of one rewrite share it).
    entries = [e for key, section in report.items() if isinstance(section, list) and key not in
               ("skipped", "rules", "graph_reordered") for e in section if isinstance(e, dict)]
    unverified = [e for e in entries if not isinstance(e.get("verify"), dict)]
    failed = [e for e in entries if isinstance(e.get("verify"), dict) and e["verify"].get("passed") is not True]
    problems = []
    if summary["failed"] or summary["passed"] != summary["rewrites"]:
        problems.append(f"{summary['failed']} of {summary['rewrites']} rewrites failed verification")
    if summary["rewrites"] == 0:
        problems.append("nothing was verified (0 rewrites)")
    if failed:
        problems.append(f"{len(failed)} report entries with a verify object that did not pass"
                        f" (first: {json.dumps(failed[0]['verify'])[:200]})")
    # Constants evaluated on the way carry the verdict of the rewrite that needed them, or none.
    stray = [e for e in unverified if e not in report.get("evaluated", [])]
    if stray:
        problems.append(f"{len(stray)} report entries without a verify object")
    return summary, "; ".join(problems) or None


def summarise(runs):
    walls = [r.wall for r in runs]
    return {"runs": len(runs), "wall_median": statistics.median(walls), "wall_min": min(walls),
            "wall_max": max(walls), "cpu_median": statistics.median(r.cpu for r in runs),
            "rss_max_mb": max(r.max_rss_kb for r in runs) * 1024 / MB, "walls": walls}


def bench_model(args, model):
    """Measures every tool on one model; returns the results dict (with errors recorded, not raised)."""
    path = model.path(args.out_dir)
    files = model_files(path)
    size = sum(f.stat().st_size for f in files)
    counts, _ = op_counts(path)
    result = {"model": model.name, "description": model.description, "files": [str(f) for f in files],
              "bytes": size, "bn_in": counts.get("BatchNormalization", 0), "nodes_in": sum(counts.values()),
              "tools": {}, "errors": {}}
    folded = args.out_dir / "folded" / model.name / "model.onnx"
    if "ort-compare" in args.tools and "ort-compare" not in model.skip_tools and not model.large and not args.no_ort:
        # The ORT comparison's second model: bnfold's output, made once, untimed.
        clear_folder(folded.parent)
        run = measure([args.build_dir / "apps/bnfold", "fold", files[0], "-o", folded, "-q"])
        if run.returncode != 0:
            fail(f"bnfold fold {files[0]} failed: {run.stderr.strip()[-300:]}")
    tools = make_tools(args, model, files, folded)
    runs = {tool.key: [] for tool in tools}
    in_process = {pseudo: [] for _, pseudo in IN_PROCESS.values()}
    scratch = args.out_dir / "run"
    for iteration in range(args.warmup + args.runs):
        for tool in tools:
            if tool.key in result["errors"]:
                continue
            out = scratch / tool.key
            clear_folder(out)
            run = measure(tool.argv(out))
            if run.returncode != 0:
                message = (run.stderr.strip() or run.stdout.strip() or f"exit {run.returncode}").splitlines()[-1]
                result["errors"][tool.key] = f"exit {run.returncode}: {message}"
                log(f"  {model.name}: {TOOL_LABELS[tool.key]} failed: {result['errors'][tool.key]}")
                continue
            if tool.key == "bnfold-verify":
                # Every run, warm-up included: a benchmark of a verification that failed is no benchmark.
                summary, problem = check_verification(out / "report.json")
                if problem:
                    result["errors"][tool.key] = f"--verify did not verify: {problem}"
                    log(f"  {model.name}: {TOOL_LABELS[tool.key]} failed: {result['errors'][tool.key]}")
                    continue
                result["verification"] = summary
            if iteration == 0:
                inspect_output(args, model, tool.key, path, out, result)
            if iteration < args.warmup:
                continue
            runs[tool.key].append(run)
            if tool.key in IN_PROCESS:
                field, pseudo = IN_PROCESS[tool.key]
                try:
                    timing = json.loads(run.stdout.strip().splitlines()[-1])
                    in_process[pseudo].append(timing[field])
                    if tool.key == "ort-compare":
                        result["ort_compare_check"] = {k: timing.get(k) for k in ("ok", "max_abs", "max_rel")}
                except (ValueError, KeyError, IndexError):
                    result["errors"][pseudo] = f"no timing line from {tool.key}: {run.stdout[:200]}"
        clear_folder(scratch)
    for key, tool_runs in runs.items():
        if tool_runs and key not in result["errors"]:
            result["tools"][key] = summarise(tool_runs)
            phases = [parse_phases(r.stderr) for r in tool_runs]
            if all(phases):
                result["tools"][key]["phases"] = {name: statistics.median(p[name] for p in phases)
                                                  for name in phases[0]}
    for key, (_, pseudo) in IN_PROCESS.items():
        times = in_process[pseudo]
        if times and key in result["tools"] and pseudo not in result["errors"]:
            result["tools"][pseudo] = {"runs": len(times), "wall_median": statistics.median(times),
                                       "wall_min": min(times), "wall_max": max(times), "cpu_median": None,
                                       "rss_max_mb": result["tools"][key]["rss_max_mb"], "walls": times}
    shutil.rmtree(scratch, ignore_errors=True)
    shutil.rmtree(folded.parent, ignore_errors=True)
    return result


def inspect_output(args, model, tool_key, original, out, result):
    """After the first run of a tool: what its output holds (BN left, file sizes), and for bnfold whether the
    outputs still match in ONNX Runtime."""
    if tool_key not in ("bnfold", "ort"):
        return
    written = out / "model.onnx"
    info = {"model_bytes": written.stat().st_size,
            "data_bytes": sum(f.stat().st_size for f in out.iterdir() if f.name != "model.onnx")}
    counts, proto = op_counts(written)
    info["bn_out"] = counts.get("BatchNormalization", 0)
    info["nodes_out"] = sum(counts.values())
    inline = [t for t in proto.graph.initializer if not t.external_data]
    info["largest_inline_tensor_bytes"] = max((len(t.raw_data) for t in inline), default=0)
    if model.large:
        missing = [f for f in model_files(written)[1:] if not f.exists() or f.parent != out]
        info["external_data_beside_output"] = not missing
    if tool_key == "bnfold" and args.verify and not args.no_ort and not model.large:
        compare = subprocess.run(
            ["node", SCRIPTS / "ort/compare.js", original, written, "--json", "--atol", str(VERIFY_ATOL),
             "--rtol", str(VERIFY_RTOL)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            details = json.loads(compare.stdout)
            info["ort_check"] = {
                "ok": bool(details.get("ok")) and compare.returncode == 0,
                "max_abs": max((o.get("max_abs") or 0 for o in details.get("outputs", [])), default=None),
                "max_rel": max((o.get("max_rel") or 0 for o in details.get("outputs", [])), default=None),
                "error": details.get("error")}
        except ValueError:
            info["ort_check"] = {"ok": False, "error": (compare.stderr or compare.stdout).strip()[:300]}
    result[f"{tool_key}_output"] = info


# ---------------------------------------------------------------------------------------------------------------
# Rule scaling

PHASE_PATTERN = re.compile(r"\b(load|rules|save|total)\b\s*[:=]?\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*s\b")


def bnfold_has_timings(bnfold):
    help_text = subprocess.run([bnfold, "fold", "--help"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True).stdout
    return "--timings" in help_text


def parse_phases(stderr):
    for line in stderr.splitlines():
        if "timings" in line:
            return {name: float(value) for name, value in PHASE_PATTERN.findall(line)}
    return {}


def rule_instructions(bnfold, model_path, scratch):
    """Instructions executed inside bnfold::runRules (callgrind), or None without valgrind. Unlike time, the
    count does not depend on caches, page faults or other processes, so it shows the algorithm's own growth."""
    if shutil.which("valgrind") is None:
        return None
    clear_folder(scratch)
    out_file = scratch / "callgrind.out"
    run = subprocess.run(["valgrind", "--tool=callgrind", f"--callgrind-out-file={out_file}",
                          "--toggle-collect=bnfold::runRules*", bnfold, "fold", model_path, "-o",
                          scratch / "model.onnx", "-q"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    match = re.search(r"Collected\s*:\s*([0-9]+)", run.stderr)
    if run.returncode != 0 or not match:
        fail(f"callgrind on {model_path} failed: {run.stderr.strip()[-300:]}")
    return int(match.group(1))


def bench_scaling(args):
    bnfold = args.build_dir / "apps/bnfold"
    timings = bnfold_has_timings(bnfold)
    sizes = [args.scaling_blocks, 10 * args.scaling_blocks]
    results = {"method": "bnfold --timings (rules phase)" if timings else
               "median(default rules) - median(--rules none), CPU time", "sizes": []}
    scratch = args.out_dir / "run"
    paths, runs, bn_left = {}, {}, {}
    for blocks in sizes:
        chain = Model(f"chain-{blocks}", [SCRIPTS / "bench/gen_conv_chain.py", "{out}", "--blocks", str(blocks)],
                      "residual Conv+BN chain")
        generate(chain, args.out_dir, None)
        paths[blocks] = chain.path(args.out_dir)
        runs[blocks] = {"default": [], "none": []}
    # The rules phase alone, with and without the CPU caches emptied before it (apps/tools/rule_phase.cpp): after
    # loading, the N-block chain is still cached and the 10N-block one is not. Emptied at both sizes, the ratio
    # shows the growth of the rules' own work apart from that. Beside the target's figure, not instead of it.
    rule_phase_tool = args.build_dir / "apps/bnfold_rule_phase"
    cache_modes = {"cached": [], "emptied": ["--empty-caches"]} if rule_phase_tool.exists() else {}
    # The same again pinned to one core, a different one each iteration, both sizes on the same core one after the
    # other. On a VM whose cores the host shares, a core is at times much slower for the small model (the 1,000-block
    # phase took 12 ms on one core and 6.7 ms on the other, and 10,000 blocks about the same on both): unpinned runs
    # of the small model then fall into two groups, and their median says which core they happened to get.
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    if not (rule_phase_tool.exists() and len(cores) > 1 and shutil.which("taskset")):
        cores = []
    for blocks in sizes:
        runs[blocks].update({f"phase_{mode}": [] for mode in cache_modes})
        if cores:
            runs[blocks]["phase_pinned"] = []  # (core, seconds)

    def rule_phase(blocks, extra, pin=()):
        run = subprocess.run([*pin, rule_phase_tool, paths[blocks], *extra], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
        match = re.search(r"rules ([0-9.]+) s", run.stdout)
        if run.returncode != 0 or not match:
            fail(f"{rule_phase_tool} {paths[blocks]} failed: {run.stderr.strip()[:300]}")
        return float(match.group(1))

    # N and 10N take turns, so that both sizes see the same conditions on a machine whose speed drifts.
    for iteration in range(args.warmup + args.scaling_runs):
        core = cores[iteration % len(cores)] if cores else None
        for blocks in sizes:
            timed = {mode: rule_phase(blocks, extra) for mode, extra in cache_modes.items()}
            if core is not None:
                timed["pinned"] = (core, rule_phase(blocks, [], ["taskset", "-c", str(core)]))
            if iteration >= args.warmup:
                for mode, result in timed.items():
                    runs[blocks][f"phase_{mode}"].append(result)
            for key, extra in (("default", []), ("none", ["--rules", "none"])):
                clear_folder(scratch)
                argv = [bnfold, "fold", paths[blocks], "-o", scratch / "model.onnx", "-q"] + extra
                if timings:
                    argv.append("--timings")
                run = measure(argv)
                if run.returncode != 0:
                    fail(f"bnfold fold {paths[blocks]} {' '.join(extra)} failed: {run.stderr.strip()[:300]}")
                if iteration >= args.warmup:
                    runs[blocks][key].append(run)
                if iteration == 0 and key == "default":
                    out_counts, _ = op_counts(scratch / "model.onnx")
                    bn_left[blocks] = out_counts.get("BatchNormalization", 0)
    for blocks in sizes:
        path = paths[blocks]
        counts, _ = op_counts(path)
        entry = {"blocks": blocks, "nodes": sum(counts.values()), "bytes": path.stat().st_size,
                 "bn_in": counts.get("BatchNormalization", 0), "bn_out": bn_left[blocks]}
        for mode in cache_modes:
            entry[f"rule_phase_{mode}"] = statistics.median(runs[blocks].pop(f"phase_{mode}"))
        if cores:
            pinned = runs[blocks].pop("phase_pinned")
            entry["rule_phase_by_core"] = {core: statistics.median(t for c, t in pinned if c == core)
                                           for core in sorted({c for c, _ in pinned})}
        for key, key_runs in runs[blocks].items():
            entry[f"{key}_wall"] = statistics.median(r.wall for r in key_runs)
            entry[f"{key}_cpu"] = statistics.median(r.cpu for r in key_runs)
            entry[f"{key}_rss_mb"] = max(r.max_rss_kb for r in key_runs) * 1024 / MB
        if args.instructions:
            log(f"counting the rules phase's instructions on chain-{blocks} (callgrind)")
            entry["rule_instructions"] = rule_instructions(bnfold, path, scratch)
        entry["rule_wall"] = entry["default_wall"] - entry["none_wall"]
        entry["rule_cpu"] = entry["default_cpu"] - entry["none_cpu"]
        if timings:
            phases = [parse_phases(r.stderr) for r in runs[blocks]["default"]]
            entry["phases"] = {name: statistics.median(p[name] for p in phases if name in p)
                               for name in {n for p in phases for n in p}}
            entry["rule_phase_runs"] = [p["rules"] for p in phases if "rules" in p]
            if "rules" in entry["phases"]:
                entry["rule_phase"] = entry["phases"]["rules"]
        results["sizes"].append(entry)
    shutil.rmtree(scratch, ignore_errors=True)
    small, big = results["sizes"]
    # CPU time is the primary figure when bnfold cannot time its phases: on a shared machine wall time also
    # holds waiting for a core, which does not subtract out.
    key = "rule_phase" if "rule_phase" in small and "rule_phase" in big else "rule_cpu"
    results["ratio_key"] = key
    results["ratio"] = big[key] / small[key] if small[key] > 0 else None
    results["ratio_wall"] = big["rule_wall"] / small["rule_wall"] if small["rule_wall"] > 0 else None
    for mode in cache_modes:
        results[f"ratio_caches_{mode}"] = big[f"rule_phase_{mode}"] / small[f"rule_phase_{mode}"]
    if cores:
        by_core = {core: big["rule_phase_by_core"][core] / small["rule_phase_by_core"][core]
                   for core in small["rule_phase_by_core"]}
        results["ratio_by_core"] = by_core
        # The core the small model ran fastest on is the one the host disturbed least: its ratio is the one an idle
        # machine would show. A disturbed core slows the small model's phase more than the large one's, which
        # pulls its ratio down.
        quiet = min(small["rule_phase_by_core"], key=small["rule_phase_by_core"].get)
        results["quiet_core"] = quiet
        results["ratio_quiet_core"] = by_core[quiet]
    counts = small.get("rule_instructions"), big.get("rule_instructions")
    results["ratio_instructions"] = counts[1] / counts[0] if all(counts) else None
    if key == "rule_phase":
        results["ratio_interval"] = ratio_interval(small["rule_phase_runs"], big["rule_phase_runs"])
        results["ratio_fastest"] = min(big["rule_phase_runs"]) / min(small["rule_phase_runs"])
    return results


def ratio_interval(small_runs, big_runs, resamples=2000, seed=0):
    """A 95% bootstrap interval of median(big_runs) / median(small_runs): how far this run's ratio could move
    with other draws of this machine's noise. The runs of each size are resampled on their own. None with fewer
    than 5 runs of either size, where the interval says nothing."""
    if min(len(small_runs), len(big_runs)) < 5:
        return None
    draw = random.Random(seed)
    ratios = sorted(statistics.median(draw.choices(big_runs, k=len(big_runs))) /
                    statistics.median(draw.choices(small_runs, k=len(small_runs))) for _ in range(resamples))
    return ratios[int(0.025 * resamples)], ratios[int(0.975 * resamples) - 1]


# ---------------------------------------------------------------------------------------------------------------
# Printing

def ratio(a, b):
    if a is None or not b:
        return "-"
    return f"{a / b:.0f}x" if a / b >= 100 else f"{a / b:.2f}x"


def print_model_table(result):
    tools = result["tools"]
    size_mb = result["bytes"] / MB
    print(f"\n## {result['model']}: {result['description']}; {size_mb:.1f} MB in {len(result['files'])} file(s), "
          f"{result['nodes_in']} nodes, {result['bn_in']} BatchNormalization")
    if len(result["files"]) > 1:
        print("(external data: the floor parses and writes the graph file only, so /floor means little here)")
    header = (f"{'tool':<22}{'median s':>10}{'min s':>9}{'max s':>9}{'cpu s':>8}{'peak RSS MB':>13}"
              f"{'RSS/size':>10}{'/floor':>9}{'/ORT create':>12}{'/cp':>9}")
    print(header)
    print("-" * len(header))
    floor = tools.get("floor", {}).get("wall_median")
    ort = tools.get("ort-create", {}).get("wall_median")
    cp = tools.get("cp", {}).get("wall_median")
    for key in TOOLS[:5] + ["ort-create"] + TOOLS[5:] + ["ort-compare-in"]:
        if key in result["errors"]:
            print(f"{TOOL_LABELS[key]:<22}  FAILED: {result['errors'][key]}")
            continue
        if key not in tools:
            continue
        t = tools[key]
        cpu = f"{t['cpu_median']:.3f}" if t["cpu_median"] is not None else "-"
        pseudo = key in ("ort-create", "ort-compare-in")
        rss = f"{t['rss_max_mb']:.0f}" if not pseudo else "(same)"
        rss_ratio = f"{t['rss_max_mb'] / size_mb:.2f}" if not pseudo else ""
        print(f"{TOOL_LABELS[key]:<22}{t['wall_median']:>10.3f}{t['wall_min']:>9.3f}{t['wall_max']:>9.3f}{cpu:>8}"
              f"{rss:>13}{rss_ratio:>10}{ratio(t['wall_median'], floor):>9}{ratio(t['wall_median'], ort):>12}"
              f"{ratio(t['wall_median'], cp):>9}")
    for key in ("bnfold", "ort"):
        info = result.get(f"{key}_output")
        if not info:
            continue
        line = (f"{TOOL_LABELS[key]} output: BatchNormalization {result['bn_in']} -> {info['bn_out']}, "
                f"model file {info['model_bytes'] / MB:.1f} MB + data {info['data_bytes'] / MB:.1f} MB, "
                f"largest inline tensor {info['largest_inline_tensor_bytes'] / MB:.1f} MB")
        if "external_data_beside_output" in info:
            line += f", external data beside output: {'yes' if info['external_data_beside_output'] else 'NO'}"
        check = info.get("ort_check")
        if check:
            line += f"; ORT outputs {'match' if check['ok'] else 'DIFFER'} (atol {VERIFY_ATOL}, rtol {VERIFY_RTOL}"
            for field in ("max_abs", "max_rel"):
                if check.get(field) is not None:
                    line += f", {field} {check[field]:.2e}"
            line += ")"
            if check.get("error"):
                line += f" error: {check['error']}"
        print(line)
    print_verify_lines(result)


def print_verify_lines(result):
    """fold --verify against plain fold and against the ORT comparison (issue 15), and what it verified."""
    tools = result["tools"]
    verify = tools.get("bnfold-verify")
    if not verify:
        return
    fold = tools.get("bnfold", {})
    line = f"fold --verify: {verify['wall_median']:.3f} s = {ratio(verify['wall_median'], fold.get('wall_median'))} fold"
    for key in ("ort-compare-in", "ort-compare"):
        if key in tools:
            line += f", {ratio(verify['wall_median'], tools[key]['wall_median'])} {TOOL_LABELS[key]}"
    phases = fold.get("phases", {}), verify.get("phases", {})
    if "rules" in phases[0] and "rules" in phases[1]:
        line += (f"; rules phase {phases[0]['rules']:.4f} s -> {phases[1]['rules']:.4f} s with --verify "
                 f"(load {phases[1].get('load', 0):.4f} s, save {phases[1].get('save', 0):.4f} s)")
    print(line)
    summary = result.get("verification")
    if summary:
        print(f"fold --verify report: {summary['rewrites']} rewrites verified, {summary['passed']} passed, "
              f"{summary['failed']} failed (every run checked)")
    check = result.get("ort_compare_check")
    if check:
        print(f"ORT compare: outputs {'match' if check.get('ok') else 'DIFFER'}"
              + (f" (max_abs {check['max_abs']:.2e}, max_rel {check['max_rel']:.2e})"
                 if check.get("max_abs") is not None and check.get("max_rel") is not None else ""))


def print_scaling(scaling):
    print(f"\n## rule scaling: residual Conv+BN chain, N and 10N blocks ({scaling['method']})")
    header = (f"{'blocks':>7}{'nodes':>8}{'MB':>7}{'BN in->out':>12}{'default s':>11}{'none s':>9}{'rules s':>9}"
              f"{'default cpu':>13}{'none cpu':>10}{'rules cpu':>11}{'peak RSS MB':>13}")
    print(header)
    print("-" * len(header))
    for e in scaling["sizes"]:
        phase = f"  (rules phase {e['rule_phase']:.4f} s)" if "rule_phase" in e else ""
        print(f"{e['blocks']:>7}{e['nodes']:>8}{e['bytes'] / MB:>7.1f}{str(e['bn_in']) + '->' + str(e['bn_out']):>12}"
              f"{e['default_wall']:>11.3f}{e['none_wall']:>9.3f}{e['rule_wall']:>9.3f}{e['default_cpu']:>13.3f}"
              f"{e['none_cpu']:>10.3f}{e['rule_cpu']:>11.3f}{e['default_rss_mb']:>13.0f}{phase}")
    r, rw = scaling["ratio"], scaling["ratio_wall"]
    if r is None:
        print("rule time at N is not above measurement noise: use more blocks (--scaling-blocks)")
    print(f"rule time 10N / N: {'-' if r is None else f'{r:.1f}x'} ({scaling['ratio_key']}; from wall times "
          f"{'-' if rw is None else f'{rw:.1f}x'}); linear would be 10x, target <= 11x")
    interval = scaling.get("ratio_interval")
    if interval:
        small, big = scaling["sizes"]
        spread = ", ".join(f"{e['blocks']} blocks {min(e['rule_phase_runs']):.4f} / "
                           f"{e['rule_phase']:.4f} / {max(e['rule_phase_runs']):.4f} s"
                           for e in (small, big))
        print(f"  95% bootstrap interval of that ratio: {interval[0]:.1f}x - {interval[1]:.1f}x; of the fastest runs: "
              f"{scaling['ratio_fastest']:.1f}x (rules phase min / median / max: {spread})")
    if "ratio_caches_emptied" in scaling:
        small, big = scaling["sizes"]
        print("rules phase alone (bnfold_rule_phase), caches as loading left them: "
              f"{small['rule_phase_cached']:.4f} s -> {big['rule_phase_cached']:.4f} s = "
              f"{scaling['ratio_caches_cached']:.1f}x; caches emptied first at both sizes: "
              f"{small['rule_phase_emptied']:.4f} s -> {big['rule_phase_emptied']:.4f} s = "
              f"{scaling['ratio_caches_emptied']:.1f}x")
    if "ratio_by_core" in scaling:
        small, big = scaling["sizes"]
        cores = "; ".join(f"core {core}: {small['rule_phase_by_core'][core]:.4f} s -> "
                          f"{big['rule_phase_by_core'][core]:.4f} s = {ratio:.1f}x"
                          for core, ratio in scaling["ratio_by_core"].items())
        print(f"rules phase alone, pinned to each core in turn (medians): {cores}; on the core where the small model "
              f"ran fastest (least disturbed by the host): {scaling['ratio_quiet_core']:.1f}x")
    ri = scaling.get("ratio_instructions")
    if ri is not None:
        small, big = scaling["sizes"]
        print(f"rules-phase instructions (callgrind): {small['rule_instructions']:,} -> {big['rule_instructions']:,}, "
              f"10N / N: {ri:.2f}x")


def check_targets(results, scaling):
    """The issue's targets as (description, measured, pass/fail) lines."""
    lines = []
    by_name = {r["model"]: r for r in results}

    def median(model, tool):
        return by_name.get(model, {}).get("tools", {}).get(tool, {}).get("wall_median")

    def cpu(model, tool):
        return by_name.get(model, {}).get("tools", {}).get(tool, {}).get("cpu_median")

    resnet = by_name.get("resnet50")
    if resnet:
        fold, floor, ort, cp = (median("resnet50", t) for t in ("bnfold", "floor", "ort-create", "cp"))
        if fold and floor:
            lines.append(("ResNet-50 fold wall <= 1.2x floor", f"{fold / floor:.2f}x (CPU time "
                          f"{cpu('resnet50', 'bnfold') / cpu('resnet50', 'floor'):.2f}x)", fold <= 1.2 * floor))
        if fold and ort:
            lines.append(("ResNet-50 fold >= 3x faster than ORT create", f"{ort / fold:.2f}x faster", ort >= 3 * fold))
        if "bnfold" in resnet["tools"]:
            rss = resnet["tools"]["bnfold"]["rss_max_mb"] / (resnet["bytes"] / MB)
            lines.append(("ResNet-50 peak RSS <= 1.3x file size", f"{rss:.2f}x", rss <= 1.3))
        if fold and cp:
            lines.append(("ResNet-50 stretch: fold within 2x of cp", f"{fold / cp:.1f}x", fold <= 2 * cp))
    if resnet:
        verify, fold, compare = (median("resnet50", t) for t in ("bnfold-verify", "bnfold", "ort-compare-in"))
        if "bnfold-verify" in resnet["errors"]:
            lines.append(("ResNet-50 fold --verify verifies every rewrite", resnet["errors"]["bnfold-verify"], False))
        if verify and fold:
            lines.append(("ResNet-50 fold --verify wall <= 5x fold", f"{verify / fold:.2f}x", verify <= 5 * fold))
        if verify and compare:
            process = median("resnet50", "ort-compare")
            lines.append(("ResNet-50 fold --verify faster than ORT comparison", f"{verify / compare:.2f}x the "
                          f"comparison's in-process time ({ratio(verify, process)} its process)", verify < compare))
    heavy = by_name.get("graph-heavy")
    if heavy:
        fold, none, floor = (median("graph-heavy", t) for t in ("bnfold", "bnfold-none", "floor"))
        tools = heavy["tools"]
        if fold and floor:
            lines.append(("graph-heavy fold wall <= 2x floor", f"{fold / floor:.2f}x", fold <= 2 * floor))
        if none and floor:
            lines.append(("graph-heavy --rules none wall <= 1.3x floor", f"{none / floor:.2f}x", none <= 1.3 * floor))
        if "floor" in tools:
            floor_rss = tools["floor"]["rss_max_mb"]
            for tool, label in (("bnfold", "fold"), ("bnfold-none", "--rules none")):
                if tool in tools:
                    rss = tools[tool]["rss_max_mb"] / floor_rss
                    lines.append((f"graph-heavy {label} peak RSS <= 1.5x floor's", f"{rss:.2f}x", rss <= 1.5))
    large = by_name.get("large")
    if large:
        if "bnfold" in large["tools"]:
            rss = large["tools"]["bnfold"]["rss_max_mb"] / (large["bytes"] / MB)
            lines.append((">2 GB peak RSS <= 10% of size", f"{100 * rss:.1f}%", rss <= 0.10))
            fold, cp = median("large", "bnfold"), median("large", "cp")
            if cp:
                lines.append((">2 GB fold wall <= 2x cp", f"{fold / cp:.2f}x", fold <= 2 * cp))
        else:
            lines.append((">2 GB fold runs", large["errors"].get("bnfold", "not run"), False))
        info = large.get("bnfold_output")
        if info:
            ok = info.get("external_data_beside_output") and info["model_bytes"] < 16 * (1 << 20)
            lines.append((">2 GB output: small model file, external data beside it",
                          f"model file {info['model_bytes'] / MB:.1f} MB, data {info['data_bytes'] / MB:.0f} MB", ok))
    if scaling and scaling["ratio"] is not None:
        interval = scaling.get("ratio_interval")
        measured = f"{scaling['ratio']:.1f}x" + (f" (95% {interval[0]:.1f}-{interval[1]:.1f}x)" if interval else "")
        lines.append(("rule time 10x nodes <= 11x", measured, scaling["ratio"] <= 11))
    if scaling and scaling.get("ratio_quiet_core") is not None:
        lines.append(("rule time 10x nodes <= 11x, pinned to the quietest core",
                      f"{scaling['ratio_quiet_core']:.1f}x (core {scaling['quiet_core']})",
                      scaling["ratio_quiet_core"] <= 11))
    if scaling and scaling.get("ratio_instructions") is not None:
        lines.append(("rule instructions 10x nodes <= 11x (callgrind)", f"{scaling['ratio_instructions']:.2f}x",
                      scaling["ratio_instructions"] <= 11))
    return lines


# ---------------------------------------------------------------------------------------------------------------

def parse_args():
    parser = argparse.ArgumentParser(description="bnfold benchmark (see scripts/bench/run_bench.sh and BENCHMARKS.md).")
    parser.add_argument("--build-dir", type=pathlib.Path, default=REPO / "build-bench",
                        help="build folder holding apps/bnfold, apps/bnfold_proto_roundtrip and (optional) "
                             "apps/bnfold_rule_phase")
    parser.add_argument("--out-dir", type=pathlib.Path, default=REPO / "bench-out",
                        help="generated models and scratch outputs (default: bench-out/, git-ignored)")
    parser.add_argument("--quick", action="store_true",
                        help="smoke run: 1 warm-up + 1 run, no >2 GB model, 300/3000-block scaling, no callgrind")
    parser.add_argument("--runs", type=int, default=5, help="measured runs per tool (median reported)")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--models", default=",".join(m.name for m in MODELS),
                        help="comma-separated subset of: " + ", ".join(m.name for m in MODELS))
    parser.add_argument("--skip-large", action="store_true", help="leave out the >2 GB model")
    parser.add_argument("--large-size-gb", type=float, default=2.1)
    parser.add_argument("--no-ort", action="store_true", help="do not run ONNX Runtime")
    parser.add_argument("--no-verify", dest="verify", action="store_false",
                        help="do not compare bnfold's outputs with the original's in ONNX Runtime")
    parser.add_argument("--scaling-blocks", type=int, default=1000, help="N of the N / 10N scaling measurement")
    parser.add_argument("--scaling-runs", type=int, default=None,
                        help="runs per scaling point (default: --runs, and at least 21 unless --quick)")
    parser.add_argument("--no-scaling", action="store_true")
    parser.add_argument("--no-instructions", dest="instructions", action="store_false",
                        help="skip the callgrind instruction count of the rules phase (about 2 minutes)")
    parser.add_argument("--tools", default=",".join(TOOLS),
                        help="comma-separated subset of: " + ", ".join(TOOLS) + " (e.g. bnfold,bnfold-verify,"
                        "ort-compare for issue 15's figures alone)")
    parser.add_argument("--json", type=pathlib.Path, help="also write all figures here")
    args = parser.parse_args()
    if args.quick:
        args.runs, args.warmup, args.skip_large, args.scaling_blocks = 1, 1, True, 300
        args.instructions = False
    if args.runs < 1 or args.warmup < 0 or args.scaling_blocks < 1:
        parser.error("--runs and --scaling-blocks must be positive, --warmup non-negative")
    if args.scaling_runs is None:
        # A 1,000-block rules phase lasts a few milliseconds, and on a shared VM many such runs take 1.5-2.5 times
        # as long as the fastest: the ratio of medians needs more runs than the whole-model timings do to settle.
        args.scaling_runs = args.runs if args.quick else max(args.runs, 21)
    args.build_dir = args.build_dir.resolve()
    args.out_dir = args.out_dir.resolve()
    known = {m.name for m in MODELS}
    args.models = [name for name in args.models.split(",") if name]
    unknown = [name for name in args.models if name not in known]
    if unknown:
        parser.error(f"unknown model(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
    args.tools = [name for name in args.tools.split(",") if name]
    unknown = [name for name in args.tools if name not in TOOLS]
    if unknown:
        parser.error(f"unknown tool(s) {', '.join(unknown)}; known: {', '.join(TOOLS)}")
    if args.skip_large and "large" in args.models:
        args.models.remove("large")
    return args


def main():
    args = parse_args()
    for tool in ("apps/bnfold", "apps/bnfold_proto_roundtrip"):
        if not (args.build_dir / tool).is_file():
            fail(f"{args.build_dir / tool} not found: build it (scripts/bench/run_bench.sh does)")
    if not args.no_ort and shutil.which("node") is None:
        fail("node not found on PATH (or pass --no-ort)")
    args.out_dir.mkdir(parents=True, exist_ok=True)
    build_measure(args.out_dir)
    selected = [m for m in MODELS if m.name in args.models]
    for model in (m for m in selected if m.large):
        # The model and one output at a time (outputs are deleted after every run), plus slack.
        needed = (2 if not model.path(args.out_dir).exists() else 1) * 1.1 * args.large_size_gb * GIB + 0.5 * GIB
        if free_bytes(args.out_dir) < needed:
            fail(f"{args.out_dir}: {free_bytes(args.out_dir) / GIB:.1f} GiB free, the >2 GB model needs "
                 f"{needed / GIB:.1f} GiB (or pass --skip-large)")

    machine = machine_description()
    print(f"# bnfold benchmark  {time.strftime('%Y-%m-%d %H:%M')}")
    print(f"machine: {machine['nproc']} cores, {machine['cpu']}, {machine['ram_gib']} GiB RAM, Linux "
          f"{machine['kernel']}; load average at start {machine['loadavg_start'][0]:.2f}")
    baseline = statistics.median(measure(["true"]).max_rss_kb for _ in range(3)) * 1024 / MB
    machine["rss_baseline_mb"] = baseline
    print(f"runs: {args.warmup} warm-up + {args.runs} measured per tool, round-robin; wall = median; "
          f"cpu = median user+sys; peak RSS = max ru_maxrss; ratios are of median walls; /ORT create = against "
          f"ORT's session creation measured in-process (node start-up excluded); peak RSS of `true` "
          f"under the same stopwatch: {baseline:.1f} MB")

    results = []
    for model in selected:
        generate(model, args.out_dir, args.large_size_gb)
        log(f"benchmarking {model.name}")
        result = bench_model(args, model)
        results.append(result)
        print_model_table(result)
        sys.stdout.flush()

    scaling = None
    if not args.no_scaling:
        log("measuring rule scaling")
        scaling = bench_scaling(args)
        print_scaling(scaling)

    targets = check_targets(results, scaling)
    if targets:
        print("\n## targets (issues 7, 15 and 16)")
        for description, measured, ok in targets:
            print(f"{'PASS' if ok else 'FAIL'}  {description:<55} {measured}")
    machine["loadavg_end"] = os.getloadavg()
    print(f"\nload average at end {machine['loadavg_end'][0]:.2f} (above {machine['nproc']} means other "
          f"processes competed for the cores: compare the cpu column)")
    if args.json:
        args.json.write_text(json.dumps({"machine": machine, "args": {k: str(v) for k, v in vars(args).items()},
                                         "models": results, "scaling": scaling,
                                         "targets": [{"target": d, "measured": m, "ok": ok} for d, m, ok in targets]},
                                        indent=2) + "\n")


if __name__ == "__main__":
    main()
