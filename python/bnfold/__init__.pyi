# Type stubs of the public API (docstrings: help(bnfold.fold) and docs/python.md).
import os
from typing import Any, Dict, Iterable, List, Optional, Tuple, TypeVar, Union, overload

from ._native import Error as Error, InvalidModelError as InvalidModelError, OptionError as OptionError

from onnx import ModelProto  # only for typing: at run time onnx is optional

__version__: str
DEFAULT_FAIL_ON: str

PathLike = Union[str, "os.PathLike[str]"]
Names = Union[str, Iterable[str]]
Report = Dict[str, Any]
Finding = Dict[str, Any]

class VerificationError(Error):
    report: Report
    failures: List[str]
    def __init__(self, message: str, report: Report, failures: Iterable[str]) -> None: ...

class BnfoldWarning(UserWarning): ...

_InMemory = TypeVar("_InMemory", bytes, ModelProto)

@overload
def fold(model: _InMemory, *, output: Optional[PathLike] = ..., report: Optional[PathLike] = ...,
         rules: Names = ..., keep: Names = ..., keep_op: Names = ..., input_defaults_are_constant: bool = ...,
         freeze_train_bn: bool = ..., equalize: bool = ..., max_constant_size: float = ..., verify: bool = ...,
         absorb_high_bias: bool = ..., relu6_to_relu: bool = ..., dry_run: bool = ..., in_place: bool = ..., backup_suffix: Optional[str] = ...,
         timings: bool = ..., base_dir: Optional[PathLike] = ...,
         target_opset: Optional[int] = ...) -> Tuple[Optional[_InMemory], Report]: ...
@overload
def fold(model: Union[bytearray, memoryview], *, output: Optional[PathLike] = ..., report: Optional[PathLike] = ...,
         rules: Names = ..., keep: Names = ..., keep_op: Names = ..., input_defaults_are_constant: bool = ...,
         freeze_train_bn: bool = ..., equalize: bool = ..., max_constant_size: float = ..., verify: bool = ...,
         absorb_high_bias: bool = ..., relu6_to_relu: bool = ..., dry_run: bool = ..., in_place: bool = ..., backup_suffix: Optional[str] = ...,
         timings: bool = ..., base_dir: Optional[PathLike] = ...,
         target_opset: Optional[int] = ...) -> Tuple[Optional[bytes], Report]: ...
@overload
def fold(model: PathLike, *, output: Optional[PathLike] = ..., report: Optional[PathLike] = ...,
         rules: Names = ..., keep: Names = ..., keep_op: Names = ..., input_defaults_are_constant: bool = ...,
         freeze_train_bn: bool = ..., equalize: bool = ..., max_constant_size: float = ..., verify: bool = ...,
         absorb_high_bias: bool = ..., relu6_to_relu: bool = ..., dry_run: bool = ..., in_place: bool = ..., backup_suffix: Optional[str] = ...,
         timings: bool = ..., base_dir: None = ...,
         target_opset: Optional[int] = ...) -> Tuple[Optional[str], Report]: ...

class FoldResult:
    input: str
    output: Optional[str]
    status: str
    report: Optional[Report]
    report_path: Optional[str]
    error: Optional[Error]
    def __init__(self, input: str, output: Optional[str], status: str, report: Optional[Report] = ...,
                 report_path: Optional[str] = ..., error: Optional[Error] = ...) -> None: ...
    @property
    def ok(self) -> bool: ...

def fold_many(models: Union[PathLike, Iterable[PathLike]], *, out_dir: Optional[PathLike] = ...,
              report_dir: Optional[PathLike] = ..., in_place: bool = ..., backup_suffix: Optional[str] = ...,
              dry_run: bool = ..., jobs: int = ..., rules: Names = ..., keep: Names = ..., keep_op: Names = ...,
              input_defaults_are_constant: bool = ..., freeze_train_bn: bool = ..., equalize: bool = ...,
              max_constant_size: float = ..., verify: bool = ..., absorb_high_bias: bool = ..., relu6_to_relu: bool = ...,
              timings: bool = ..., target_opset: Optional[int] = ...) -> List[FoldResult]: ...

def check(model: Union[ModelProto, bytes, bytearray, memoryview, PathLike], *, fail_on: Names = ...,
          rules: Names = ..., keep: Names = ..., keep_op: Names = ..., input_defaults_are_constant: bool = ...,
          freeze_train_bn: bool = ..., equalize: bool = ..., max_constant_size: float = ..., verify: bool = ...,
          absorb_high_bias: bool = ..., relu6_to_relu: bool = ..., base_dir: Optional[PathLike] = ...,
          target_opset: Optional[int] = ...) -> List[Finding]: ...
def info(model: Union[ModelProto, bytes, bytearray, memoryview, PathLike], *, weights: bool = ...,
         rules: Names = ..., keep: Names = ..., keep_op: Names = ..., input_defaults_are_constant: bool = ...,
         freeze_train_bn: bool = ..., max_constant_size: float = ...,
         base_dir: Optional[PathLike] = ...) -> Dict[str, Any]: ...
def rules() -> List[Tuple[str, str, bool]]: ...
def finding_categories() -> List[Tuple[str, str]]: ...
