"""bnfold: fold BatchNormalization into the layers around it, absorb bias Adds and expand training-mode
BatchNormalization in ONNX models, from Python.

The functions take a model as an ``onnx.ModelProto``, as ``bytes`` (a serialized ModelProto) or as a path
(``str`` or ``os.PathLike``) and do what the ``bnfold`` commands of the same names do (README.md)::

    import bnfold, onnx
    folded, report = bnfold.fold(onnx.load("model.onnx"))
    bnfold.fold("big.onnx", output="big.folded.onnx")    # file to file; external data never enters Python
    results = bnfold.fold_many(["models/"], out_dir="folded/")  # many files, as `bnfold fold IN... --out-dir`
    findings = bnfold.check("model.onnx")               # what `bnfold check` reports, as dicts
    info = bnfold.info("model.onnx")                    # what `bnfold info --json` prints

Errors raise ``bnfold.Error`` (``InvalidModelError``, ``OptionError``, ``VerificationError``) with the CLI's
one-line message. The library releases the GIL while it works, so threads fold models in parallel.
``onnx`` is needed only to pass or receive ModelProto objects.
"""

import dataclasses
import os
import sys
import warnings
import threading
from typing import Optional

from . import _native
from ._native import Error, InvalidModelError, OptionError

__version__ = _native.__version__

__all__ = [
    "fold",
    "fold_many",
    "FoldResult",
    "check",
    "info",
    "rules",
    "finding_categories",
    "Error",
    "InvalidModelError",
    "OptionError",
    "VerificationError",
    "BnfoldWarning",
    "DEFAULT_FAIL_ON",
    "__version__",
]

DEFAULT_FAIL_ON = _native.default_fail_on
"""The finding categories that make a finding an error unless ``fail_on`` says otherwise."""


class VerificationError(Error):
    """A rewrite failed ``verify=True``: it does not compute what the original did, so no model was returned or
    written. ``report`` is the run's report (each failing entry has a ``verify`` object) and ``failures`` one
    message per failed rewrite."""

    def __init__(self, message, report, failures):
        super().__init__(message)
        self.report = report
        self.failures = list(failures)


class BnfoldWarning(UserWarning):
    """What the CLI prints as a warning: nodes sorted on load, BatchNormalization that an option would fold."""


_MODEL_KINDS = "an onnx.ModelProto, bytes (a serialized ModelProto) or a path (str or os.PathLike)"


def _is_model_proto(model):
    # Duck-typed, so that onnx is not imported (and need not be installed) for bytes and paths.
    return type(model).__name__ == "ModelProto" and hasattr(model, "SerializeToString")


def _classify(model):
    """("proto" | "bytes" | "path", bytes or path)."""
    if _is_model_proto(model):
        return "proto", model.SerializeToString()
    if isinstance(model, bytes):
        return "bytes", model
    if isinstance(model, (bytearray, memoryview)):
        return "bytes", bytes(model)  # an immutable copy: the library reads it without the GIL
    if isinstance(model, (str, os.PathLike)):
        path = os.fspath(model)
        if isinstance(path, bytes):
            path = os.fsdecode(path)
        return "path", path
    raise TypeError(f"model must be {_MODEL_KINDS}, not {type(model).__name__}")


def _optional_path(value, name):
    if value is None:
        return ""
    if not isinstance(value, (str, os.PathLike)):
        raise TypeError(f"{name} must be a path (str or os.PathLike), not {type(value).__name__}")
    path = os.fsdecode(os.fspath(value))
    if not path:
        raise OptionError(f"{name}: an empty path")
    return path


def _names(value, name):
    if isinstance(value, (str, bytes)):
        return [value] if isinstance(value, str) else [value.decode()]
    try:
        names = list(value)
    except TypeError:
        raise TypeError(f"{name} must be a string or an iterable of strings") from None
    if not all(isinstance(item, str) for item in names):
        raise TypeError(f"{name} must be a string or an iterable of strings")
    return names


def _driver_options(rules, keep, keep_op, input_defaults_are_constant, freeze_train_bn, equalize, max_constant_size,
                    verify, absorb_high_bias, relu6_to_relu=False):
    if not isinstance(rules, str):
        rules = ",".join(_names(rules, "rules"))
    return _native.driver_options(
        rules=rules,
        keep=_names(keep, "keep"),
        keep_op=_names(keep_op, "keep_op"),
        input_defaults_are_constant=bool(input_defaults_are_constant),
        freeze_train_bn=bool(freeze_train_bn),
        equalize=bool(equalize),
        absorb_high_bias=bool(absorb_high_bias),
        relu6_to_relu=bool(relu6_to_relu),
        max_constant_size=float(max_constant_size),
        verify=bool(verify),
    )


def _source_name(kind):
    return "<ModelProto>" if kind == "proto" else "<bytes>"


def _base_dir(base_dir):
    return os.fsdecode(os.fspath(base_dir)) if base_dir is not None else os.getcwd()


def _warn_as_cli(name, report, result, stacklevel=4):
    """The warnings the CLI prints for a model, as BnfoldWarnings."""
    if report.get("graph_reordered"):
        moved = sum(entry.get("moved_nodes", 0) for entry in report["graph_reordered"])
        warnings.warn(f"{name}: nodes were not in topological order; sorted {moved} nodes", BnfoldWarning,
                      stacklevel=stacklevel)
    if result["input_defaults_hint"]:
        warnings.warn(f"{name}: {result['input_defaults_hint']}", BnfoldWarning, stacklevel=stacklevel)


def _finish(result, name):
    """Parses the report, raises VerificationError or warns as the CLI does."""
    report = result["report"]
    if result["verify_failures"]:
        lines = result["verify_failures"] + [result["verify_failure_text"]]
        raise VerificationError(f"{name}: " + "; ".join(lines), report, result["verify_failures"])
    _warn_as_cli(name, report, result)
    return report


def _target_opset(target_opset):
    if target_opset is None:
        return 0
    if isinstance(target_opset, bool) or not isinstance(target_opset, int) or target_opset < 1:
        raise OptionError(f"target_opset must be a positive int, not {target_opset!r}")
    return target_opset


def fold(model, *, output=None, report=None, rules="default", keep=(), keep_op=(),
         input_defaults_are_constant=False, freeze_train_bn=False, equalize=False, max_constant_size=64.0,
         verify=False, absorb_high_bias=False, relu6_to_relu=False, dry_run=False, in_place=False, backup_suffix=None, timings=False, base_dir=None,
         target_opset=None):
    """Rewrite a model as ``bnfold fold`` does; returns ``(model, report)``.

    model: an ``onnx.ModelProto`` or ``bytes`` (the result is of the same kind; the argument is not changed), or
        a path. A path is folded file to file: give ``output=`` (or ``in_place=True``, or ``dry_run=True``); the
        result is then the output path, and tensors in external data are streamed file to file, never read into
        Python (models over 2 GB work).
    output: where to write the model (atomically; tensors that were external stay in ``<output>.data``). For an
        in-memory model, optional: the folded model is returned and also written there.
    report: also write the JSON report to this path (``--report``).
    rules: "default", "all", "none", a comma list ("bn-fold,bias-add"), changes ("+bn-decompose,-scale-fold"),
        or a list of such items (``--rules``; see ``bnfold.rules()``).
    keep: node name globs no rule may touch (``--keep``); a string or an iterable of strings.
    keep_op: op types no rule may touch (``--keep-op``).
    input_defaults_are_constant: treat initializers that are also graph inputs (IR >= 4) as constants.
    freeze_train_bn: turn training-mode BatchNormalization into inference mode (changes the function).
    equalize: cross-layer equalization after folding (``--equalize``, same as ``+equalize`` in rules): rescales
        channels between layers joined by Relu/LeakyRelu/PRelu (also a fan-out, a channel-axis Concat, Conv ->
        Flatten -> Gemm, a residual stream) so per-tensor int8 weights lose less; exact in float.
    absorb_high_bias: high-bias absorption after equalize (``--absorb-high-bias``; needs ``equalize``): moves
        max(0, beta - 3|gamma|) of a folded BN's channels through a Relu into the next layer's bias, for activation
        quantization; exact only where the pre-activation stays above it (the report says so).
    relu6_to_relu: replace Clip(0, 6) between two layers with Relu so equalize reaches the link
        (``--relu6-to-relu``; needs ``equalize``). CHANGES THE FUNCTION where the first layer's output exceeds 6;
        the report lists each replacement with that warning (``relu6_replaced``).
    max_constant_size: largest result in MiB of an op evaluated while computing a weight (``--max-constant-size``).
    verify: check every rewrite numerically; a failure raises ``VerificationError`` and nothing is written.
    dry_run: run the rules and write nothing; the returned model is None.
    in_place: with a path, replace the input (only when something changed); ``backup_suffix`` keeps the original.
    timings: print the wall time of load, rules and save to stderr, as ``--timings`` does (paths only).
    base_dir: where external data of an in-memory model is found (default: the current folder).
    target_opset: convert the model to this ai.onnx opset (up to 17) with ONNX's version converter before the
        rules (``--target-opset``); a model it cannot convert, or whose functions or external data it would drop,
        raises Error. The report's ``opset_converted`` says from which opset.

    The report is a dict in the report's schema (schema/report.schema.json): ``report["folds"]`` lists each
    BatchNormalization folded, ``report["skipped"]`` each left in place with its reason.
    Raises InvalidModelError (unreadable or invalid model), OptionError (a bad keyword value), VerificationError,
    or Error (e.g. an output that cannot be written); nothing is written then.
    """
    kind, source = _classify(model)
    options = _driver_options(rules, keep, keep_op, input_defaults_are_constant, freeze_train_bn, equalize,
                              max_constant_size, verify, absorb_high_bias, relu6_to_relu)
    output_path = _optional_path(output, "output")
    report_path = _optional_path(report, "report")
    if backup_suffix is not None and not in_place:
        raise OptionError("backup_suffix only applies to in_place=True")
    if kind != "path":
        if in_place:
            raise OptionError("in_place=True needs a model given as a path")
        if timings:
            raise OptionError("timings=True needs a model given as a path")
        name = _source_name(kind)
        result = _native.fold_bytes(data=source, source_name=name, base_dir=_base_dir(base_dir), output=output_path,
                                    report=report_path, options=options, dry_run=bool(dry_run),
                                    target_opset=_target_opset(target_opset), transient_model=kind == "proto")
        parsed = _finish(result, name)
        if dry_run:
            return None, parsed
        folded = result["model"]
        if kind == "proto":
            folded_proto = type(model)()
            folded_proto.ParseFromString(folded)
            return folded_proto, parsed
        return folded, parsed

    if in_place:
        if output_path:
            raise OptionError("output= names another file; it cannot be combined with in_place=True")
        output_path = source
    elif not output_path and not dry_run:
        raise OptionError("a model given as a path needs output= (or in_place=True, or dry_run=True)")
    if base_dir is not None:
        raise OptionError("base_dir is for in-memory models; a path's external data is found beside it")
    result = _native.fold_path(input=source, output=output_path, report=report_path, dry_run=bool(dry_run),
                               in_place=bool(in_place), backup_suffix=backup_suffix or "", options=options,
                               target_opset=_target_opset(target_opset))
    parsed = _finish(result, source)
    if timings:
        load, rules_seconds, save = result["timings"]
        print(f"bnfold: timings: load {load:.4f} s, rules {rules_seconds:.4f} s, save {save:.4f} s, "
              f"total {load + rules_seconds + save:.4f} s", file=sys.stderr)
    return (None if dry_run else output_path), parsed


@dataclasses.dataclass(frozen=True)
class FoldResult:
    """What ``fold_many`` did with one model.

    input: the model file.
    output: where the model goes (the input itself with ``in_place``); None in a dry run without ``out_dir``.
    status: "ok" (written), "unchanged" (``in_place`` and nothing changed: the file was left alone), "dry-run"
        (nothing written) or "failed".
    report: the report as a dict (the report's schema), or None when the model could not be read or folded.
    report_path: where the report was written, or None.
    error: for "failed", the exception: ``InvalidModelError`` (unreadable or invalid model), ``VerificationError``
        (a rewrite failed ``verify``: no model written, the report was), or ``Error``; ``str(error)`` is what the
        CLI prints after "failed: ". None otherwise.
    """

    input: str
    output: Optional[str]
    status: str
    report: Optional[dict] = None
    report_path: Optional[str] = None
    error: Optional[Error] = None

    @property
    def ok(self):
        """False when the model failed."""
        return self.status != "failed"


def _paths(value, name):
    if isinstance(value, (str, bytes, os.PathLike)):
        value = [value]
    try:
        items = list(value)
    except TypeError:
        raise TypeError(f"{name} must be a path or an iterable of paths (str or os.PathLike)") from None
    if not all(isinstance(item, (str, os.PathLike)) for item in items):
        raise TypeError(f"{name} must be a path or an iterable of paths (str or os.PathLike)")
    if not items:
        raise OptionError(f"{name}: no model given")
    return [os.fsdecode(os.fspath(item)) for item in items]


def _named_error(error, path):
    """The exception as the CLI names a failed model: its message begins with the model's path."""
    message = str(error)
    if message.startswith(f"{path}: "):
        return error
    return type(error)(f"{path}: {message}")


def _fold_planned(input_path, output, report_path, options, dry_run, in_place, backup_suffix, target_opset):
    """Folds one model of fold_many (without the GIL in the library); failures are results, as in the CLI."""
    try:
        result = _native.fold_path(input=input_path, output=output, report="" if dry_run else report_path,
                                   dry_run=dry_run, in_place=in_place, backup_suffix=backup_suffix, options=options,
                                   create_folders=True, target_opset=target_opset)
    except Error as error:
        return FoldResult(input_path, output or None, "failed", error=_named_error(error, input_path)), None
    report = result["report"]
    written_report = report_path if report_path and not dry_run else None
    failures = result["verify_failures"]
    if failures:
        more = f" (and {len(failures) - 1} more)" if len(failures) > 1 else ""
        error = VerificationError(f"{input_path}: {failures[0]}{more}; no model written", report, failures)
        return FoldResult(input_path, output or None, "failed", report, written_report, error), result
    status = "dry-run" if dry_run else "unchanged" if result["unchanged"] else "ok"
    return FoldResult(input_path, output or None, status, report, written_report), result


def _on_threads(work, items, workers):
    """[work(item) for item in items], on up to `workers` threads. A thread that cannot start (a container's
    process limit) leaves its share to those that did; with none, every item runs here, one after the other. Each
    item runs once; the first exception is raised after all have finished."""
    results = [None] * len(items)
    errors = []
    indices = iter(range(len(items)))
    lock = threading.Lock()

    def worker():
        while True:
            with lock:
                index = next(indices, None)
            if index is None:
                return
            try:
                results[index] = work(items[index])
            except BaseException as error:  # re-raised below, as ThreadPoolExecutor.map would
                errors.append(error)

    threads = []
    for _ in range(workers if workers > 1 else 0):
        thread = threading.Thread(target=worker, daemon=True)
        try:
            thread.start()
        except RuntimeError:  # "can't start new thread"
            break
        threads.append(thread)
    if not threads:
        worker()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    return results


def fold_many(models, *, out_dir=None, report_dir=None, in_place=False, backup_suffix=None, dry_run=False, jobs=0,
              rules="default", keep=(), keep_op=(), input_defaults_are_constant=False, freeze_train_bn=False,
              equalize=False, max_constant_size=64.0, verify=False, absorb_high_bias=False, relu6_to_relu=False, timings=False,
              target_opset=None):
    """Fold many model files as ``bnfold fold IN... --out-dir DIR`` (or ``--in-place``) does; returns a list of
    ``FoldResult``, one per model in the order the CLI lists them.

    models: a path or an iterable of paths: model files, and folders searched recursively for ``*.onnx`` (sorted
        by their path below the folder; a model reached twice is folded once).
    out_dir: write each model under this folder, mirroring the inputs' layout (``--out-dir``); folders are made.
    report_dir: write each model's report under this folder (``--report-dir``; default: beside the written model,
        ``<model>.report.json``).
    in_place: replace each input atomically, only when something changed (``--in-place``); ``backup_suffix``
        keeps each original as ``<model><suffix>``.
    dry_run: run the rules and write nothing (no model, no report).
    jobs: models folded at once, on threads (``--jobs``; 0: one per core).
    The rule keywords, ``target_opset`` and ``timings`` are those of ``fold``.

    One model that fails does not stop the others: its result has status "failed" and the exception in ``error``
    (e.g. ``[r.error for r in results if not r.ok]``). Raises at once, before any model is folded, OptionError for
    a bad keyword and Error when a folder holds no model or two models would be written to the same file.
    """
    inputs = _paths(models, "models")
    options = _driver_options(rules, keep, keep_op, input_defaults_are_constant, freeze_train_bn, equalize,
                              max_constant_size, verify, absorb_high_bias, relu6_to_relu)
    out_dir = _optional_path(out_dir, "out_dir")
    report_dir = _optional_path(report_dir, "report_dir")
    if out_dir and in_place:
        raise OptionError("choose one of out_dir= and in_place=True")
    if backup_suffix is not None and not in_place:
        raise OptionError("backup_suffix only applies to in_place=True")
    if not out_dir and not in_place and not dry_run:
        raise OptionError("say where to write: out_dir= or in_place=True (or dry_run=True to write nothing)")
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 0:
        raise OptionError(f"jobs must be a whole number of models at once, 0 for one per core, not {jobs!r}")
    opset = _target_opset(target_opset)
    planned = _native.plan_fold_batch(inputs=inputs, out_dir=out_dir, report_dir=report_dir, in_place=bool(in_place))

    def fold_one(item):
        input_path, output, report_path = item
        return _fold_planned(input_path, output, report_path, options, bool(dry_run), bool(in_place),
                             backup_suffix or "", opset)

    workers = min(jobs or os.cpu_count() or 1, len(planned))
    if workers > 1:
        options.concurrent = False  # the models already share the cores
    runs = _on_threads(fold_one, planned, workers)
    # Warnings and timings in input order, whatever order the threads finished in.
    for result, native in runs:
        if native is None or result.status == "failed":
            continue
        _warn_as_cli(result.input, result.report, native, stacklevel=3)
        if timings:
            load, rules_seconds, save = native["timings"]
            print(f"bnfold: timings: {result.input}: load {load:.4f} s, rules {rules_seconds:.4f} s, save {save:.4f} s, "
                  f"total {load + rules_seconds + save:.4f} s", file=sys.stderr)
    return [result for result, _ in runs]


def check(model, *, fail_on=DEFAULT_FAIL_ON, rules="default", keep=(), keep_op=(),
          input_defaults_are_constant=False, freeze_train_bn=False, equalize=False, max_constant_size=64.0,
          verify=False, absorb_high_bias=False, relu6_to_relu=False, base_dir=None, target_opset=None):
    """List what ``fold`` would change and what stops it, as ``bnfold check`` does; never writes anything.

    Returns a list of dicts, one per finding: ``category`` (see ``bnfold.finding_categories()``), ``severity``
    ("error" when the category is in ``fail_on``, else "warning"), ``node``, ``message``, and ``op``, ``graph``,
    ``rule``, ``reason``, ``entry`` (None when not applicable). ``fail_on`` is a comma list of categories, "all"
    or "none" (``--fail-on``); the rule keywords are those of ``fold``. A CI gate fails when any finding has
    severity "error". An unreadable model raises InvalidModelError rather than returning an invalid-model finding.
    """
    kind, source = _classify(model)
    options = _driver_options(rules, keep, keep_op, input_defaults_are_constant, freeze_train_bn, equalize,
                              max_constant_size, verify, absorb_high_bias, relu6_to_relu)
    if not isinstance(fail_on, str):
        fail_on = ",".join(_names(fail_on, "fail_on"))
    name = source if kind == "path" else _source_name(kind)
    return _native.check(source=source, source_name=name, base_dir=_base_dir(base_dir), fail_on=fail_on,
                         options=options, target_opset=_target_opset(target_opset))


def info(model, *, weights=False, rules="default", keep=(), keep_op=(), input_defaults_are_constant=False,
         freeze_train_bn=False, max_constant_size=64.0, base_dir=None):
    """What ``bnfold info --json`` prints, as a dict: ``file``, ``ir_version``, ``producer``, ``opsets``, ``graphs``,
    ``nodes``, ``initializers``, ``initializer_bytes``, ``ops`` (an op histogram) and ``batch_normalization``
    (count and the ops producing their inputs).

    ``weights=True`` adds ``weights``, as ``info --weights --json``: per layer the int8 weight figures as loaded,
    after fold and after fold with equalize (folded in memory with the rule keywords, which need ``weights``), and
    the layers left more than 10 dB below per-channel quantization (docs/quantization.md)."""
    kind, source = _classify(model)
    name = source if kind == "path" else _source_name(kind)
    options = None
    if weights:
        options = _driver_options(rules, keep, keep_op, input_defaults_are_constant, freeze_train_bn, False,
                                  max_constant_size, False, False)
    elif (rules != "default" or keep or keep_op or input_defaults_are_constant or freeze_train_bn
          or max_constant_size != 64.0):
        raise OptionError("the rule keywords of info apply only with weights=True")
    return _native.info(source=source, source_name=name, base_dir=_base_dir(base_dir), weights_options=options)


def rules():
    """The rules bnfold has, in priority order: a list of ``(name, summary, enabled_by_default)``."""
    return [tuple(rule) for rule in _native.rules()]


def finding_categories():
    """The categories of ``check`` findings: a list of ``(name, meaning)``."""
    return [tuple(category) for category in _native.finding_categories()]


