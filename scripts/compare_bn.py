#!/usr/bin/python3
"""How many BatchNormalization nodes bnfold removes (or, with --norms, how many LayerNorm-like chains it fuses), next
to ONNX Runtime's own offline optimizer.

For every model (files, or folders searched for *.onnx): the BatchNormalization count before, after
`bnfold fold` (default rules, or --rules), and after ONNX Runtime's offline optimizer at level `basic`
(scripts/bench/ort_optimize.js), and whether bnfold's output computes the same outputs as the original in ONNX
Runtime (scripts/ort/compare.js, seeded random inputs). Counts include subgraphs (`bnfold info --json`).

Exit 0 when, for every model, bnfold leaves no more BN than ONNX Runtime and the outputs agree; 1 otherwise (each
problem named); 2 on bad arguments. With --expected FILE (a JSON object model file name -> "all"), bnfold must also
leave no BN at all in the models marked "all".

With --norms: the number of LayerNorm-like chains fused into one op by bnfold (default rules: norm-fuse) and by ONNX
Runtime's offline optimizer at level `extended` (where its LayerNorm fusions run), counted as norm ops after minus
before. ONNX Runtime's fusions are split into standard ONNX ops (LayerNormalization from opset 17, RMSNormalization
from 23) and those only ONNX Runtime reads (its contrib ops, and a LayerNormalization below opset 17); bnfold, which
emits standard ops only, must fuse at least as many chains as ONNX Runtime fuses into standard ops.

--fold-args "ARGS" passes more arguments to `bnfold fold` (e.g. "--target-opset 17": ONNX Runtime still optimizes
the original model, and its fusions below opset 17 count as ORT-only).

Usage: scripts/compare_bn.py [--bnfold PATH] [--out DIR] [--atol X] [--rtol Y] [--rules R] [--json]
                             [--expected FILE] [--norms] [--fold-args ARGS] MODEL_OR_FOLDER...
Needs node and onnxruntime-node (BNFOLD_ORT_NODE_MODULES, see scripts/ort/README.md).
"""

import argparse
import json
import os
import pathlib
import shlex
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parent.parent


def run(command):
    return subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def bn_count(bnfold, model):
    result = run([bnfold, "info", "--json", str(model)])
    if result.returncode != 0:
        raise RuntimeError(f"bnfold info failed on {model}: {result.stderr.strip()}")
    return json.loads(result.stdout)["batch_normalization"]["count"]


# Ops a norm chain is fused into: the standard ones with the opset they appear in, then ONNX Runtime's own.
STANDARD_NORMS = {"LayerNormalization": 17, "RMSNormalization": 23, "GroupNormalization": 18}
ORT_ONLY_NORMS = {"SimplifiedLayerNormalization", "SkipLayerNormalization", "SkipSimplifiedLayerNormalization"}


def norm_counts(model):
    """(standard, ORT-only) norm ops in every graph of the model: ops only ONNX Runtime reads count as ORT-only."""
    import onnx  # only --norms needs it (Debian's python3-onnx)

    proto = onnx.load(str(model), load_external_data=False)
    opset = next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), 0)
    standard = ort_only = 0

    def walk(graph):
        nonlocal standard, ort_only
        for node in graph.node:
            standard_domain = node.domain in ("", "ai.onnx")
            if standard_domain and opset >= STANDARD_NORMS.get(node.op_type, 10**9):
                standard += 1
            elif node.op_type in STANDARD_NORMS or node.op_type in ORT_ONLY_NORMS:
                ort_only += 1
            for attribute in node.attribute:
                for subgraph in ([attribute.g] if attribute.HasField("g") else []) + list(attribute.graphs):
                    walk(subgraph)

    walk(proto.graph)
    return standard, ort_only


def compare_norms(model, args, out_dir, row):
    """Fills row for --norms: norms before, chains fused by bnfold and by ONNX Runtime (standard and ORT-only)."""
    folded = out_dir / "bnfold" / model.name
    ort_out = out_dir / "ort" / model.name
    folded.parent.mkdir(parents=True, exist_ok=True)
    ort_out.parent.mkdir(parents=True, exist_ok=True)
    before, before_ort_only = norm_counts(model)
    row.update({"before": before, "ort_only": None})
    fold = run([args.bnfold, "fold", str(model), "-o", str(folded), "--rules", args.rules, "-q"] + args.fold_args)
    if fold.returncode != 0:
        row["problems"].append(f"bnfold fold failed: {fold.stderr.strip()}")
        return None
    standard, ort_only = norm_counts(folded)
    row["bnfold"] = standard - before
    if ort_only != before_ort_only:
        row["problems"].append("bnfold wrote an op only ONNX Runtime reads")
    ort = run(["node", str(ROOT / "scripts/bench/ort_optimize.js"), str(model), str(ort_out), "--level", "extended"])
    if ort.returncode != 0:
        row["problems"].append(f"ONNX Runtime's optimizer failed: {ort.stderr.strip()}")
    else:
        standard, ort_only = norm_counts(ort_out)
        row["ort"] = standard - before
        row["ort_only"] = ort_only - before_ort_only
        if row["bnfold"] < row["ort"]:
            row["problems"].append(f"bnfold fuses {row['bnfold']} norm chains, ONNX Runtime {row['ort']}")
    return folded


def models_in(paths, out_dir=None):
    """The .onnx files named or found under the folders, leaving out our own outputs (under out_dir) of a run before."""
    found = []
    skip = out_dir.resolve() if out_dir else None
    for path in map(pathlib.Path, paths):
        if path.is_dir():
            found += sorted(p for p in path.rglob("*.onnx")
                            if p.is_file() and not (skip and p.resolve().is_relative_to(skip)))
        elif path.is_file():
            found.append(path)
        else:
            sys.exit(f"compare_bn: {path}: no such file or folder")
    return found


def compare_one(model, args, out_dir):
    row = {"model": str(model), "before": None, "bnfold": None, "ort": None, "outputs_ok": None, "problems": []}
    try:
        if args.norms:
            folded = compare_norms(model, args, out_dir, row)
            if folded:
                check_outputs(model, folded, args, row)
            return row
        row["before"] = bn_count(args.bnfold, model)
        folded = out_dir / "bnfold" / model.name
        ort_out = out_dir / "ort" / model.name
        folded.parent.mkdir(parents=True, exist_ok=True)
        ort_out.parent.mkdir(parents=True, exist_ok=True)
        fold = run([args.bnfold, "fold", str(model), "-o", str(folded), "--rules", args.rules, "-q"] + args.fold_args)
        if fold.returncode != 0:
            row["problems"].append(f"bnfold fold failed: {fold.stderr.strip()}")
            return row
        row["bnfold"] = bn_count(args.bnfold, folded)
        ort = run(["node", str(ROOT / "scripts/bench/ort_optimize.js"), str(model), str(ort_out)])
        if ort.returncode != 0:
            row["problems"].append(f"ONNX Runtime's optimizer failed: {ort.stderr.strip()}")
        else:
            row["ort"] = bn_count(args.bnfold, ort_out)
        check_outputs(model, folded, args, row)
        if row["ort"] is not None and row["bnfold"] > row["ort"]:
            row["problems"].append(f"bnfold leaves {row['bnfold']} BatchNormalization, ONNX Runtime {row['ort']}")
        if args.expected.get(model.name) == "all" and row["bnfold"] != 0:
            row["problems"].append(f"bnfold leaves {row['bnfold']} BatchNormalization; every one should fold")
    except RuntimeError as error:
        row["problems"].append(str(error))
    return row


def check_outputs(model, folded, args, row):
    compare = run(["node", str(ROOT / "scripts/ort/compare.js"), str(model), str(folded), "--atol", str(args.atol),
                   "--rtol", str(args.rtol), "--json"])
    try:
        details = json.loads(compare.stdout)
    except json.JSONDecodeError:
        details = {"ok": False, "error": compare.stderr.strip()}
    row["outputs_ok"] = bool(details.get("ok")) and compare.returncode == 0
    if not row["outputs_ok"]:
        row["problems"].append(f"outputs differ from the original's (atol {args.atol}, rtol {args.rtol}): "
                               + (details.get("error") or json.dumps(details.get("outputs"))))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("paths", nargs="+", metavar="MODEL_OR_FOLDER")
    parser.add_argument("--bnfold", default=str(ROOT / "build/apps/bnfold"))
    parser.add_argument("--out", help="where the folded and ORT-optimized models go (default: a temp folder)")
    parser.add_argument("--atol", type=float, default=1e-4)
    parser.add_argument("--rtol", type=float, default=1e-3)
    parser.add_argument("--rules", default="default")
    parser.add_argument("--expected", help='JSON object: model file name -> "all" (every BN must fold)')
    parser.add_argument("--json", action="store_true", help="one JSON document instead of the table")
    parser.add_argument("--norms", action="store_true",
                        help="count LayerNorm-like chains fused (bnfold vs ONNX Runtime at level extended) instead of BN")
    parser.add_argument("--fold-args", default="", type=shlex.split,
                        help='more arguments for bnfold fold, in one string (e.g. "--target-opset 17")')
    args = parser.parse_args()
    args.expected = json.loads(pathlib.Path(args.expected).read_text()) if args.expected else {}

    models = models_in(args.paths, pathlib.Path(args.out) if args.out else None)
    if not models:
        sys.exit("compare_bn: no .onnx model found")
    with tempfile.TemporaryDirectory() as temp:
        out_dir = pathlib.Path(args.out or temp)
        rows = [compare_one(model, args, out_dir) for model in models]

    total = {key: sum(r[key] or 0 for r in rows) for key in ("before", "bnfold", "ort")}
    failed = [r for r in rows if r["problems"]]
    if args.json:
        print(json.dumps({"models": rows, "total": total, "ok": not failed}, indent=2))
    else:
        width = max(len(pathlib.Path(r["model"]).name) for r in rows)
        cell = lambda v: "-" if v is None else str(v)
        if args.norms:
            # Fused chains; "ORT-only" counts ONNX Runtime's fusions into ops other consumers cannot read.
            print(f"{'model':<{width}}  {'norm ops before':>15}  {'bnfold fused':>12}  {'ORT ext fused':>13}  "
                  f"{'ORT-only ops':>12}  outputs")
        else:
            print(f"{'model':<{width}}  {'BN before':>9}  {'bnfold':>6}  {'ORT basic':>9}  outputs")
        for r in rows:
            outputs = "-" if r["outputs_ok"] is None else ("same" if r["outputs_ok"] else "DIFFER")
            if args.norms:
                print(f"{pathlib.Path(r['model']).name:<{width}}  {cell(r['before']):>15}  {cell(r['bnfold']):>12}  "
                      f"{cell(r['ort']):>13}  {cell(r.get('ort_only')):>12}  {outputs}")
            else:
                print(f"{pathlib.Path(r['model']).name:<{width}}  {cell(r['before']):>9}  {cell(r['bnfold']):>6}  "
                      f"{cell(r['ort']):>9}  {outputs}")
        if args.norms:
            print(f"{'total':<{width}}  {total['before']:>15}  {total['bnfold']:>12}  {total['ort']:>13}")
        else:
            print(f"{'total':<{width}}  {total['before']:>9}  {total['bnfold']:>6}  {total['ort']:>9}")
        for r in failed:
            for problem in r["problems"]:
                print(f"FAIL {r['model']}: {problem}", file=sys.stderr)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
