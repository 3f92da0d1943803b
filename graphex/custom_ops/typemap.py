"""Schema types -> what the generated code writes for them: annotation, C++ type, sample value.

One table, so the three registration styles, the reproducer and the test always agree on
what an argument is. The annotations are the ones torch.library.custom_op infers the schema
from (torch/_library/infer_schema.py): `int` becomes SymInt there, which is the same op for
a graph with static shapes.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class TypeInfo:
    py: str                 # Python annotation
    cpp: str | None         # C++ kernel parameter type; None: not expressible in a kernel signature
    sample: str             # a small valid value, as Python source
    custom_op: bool = True  # whether torch.library.custom_op accepts the annotation


_T = "torch.randn(4, 8)"

TYPES: dict[str, TypeInfo] = {
    "Tensor": TypeInfo("torch.Tensor", "const at::Tensor&", _T),
    "Tensor?": TypeInfo("Optional[torch.Tensor]", "const std::optional<at::Tensor>&", _T),
    "Tensor[]": TypeInfo("list[torch.Tensor]", "at::TensorList", f"[{_T}, {_T}]"),
    "Tensor?[]": TypeInfo("list[Optional[torch.Tensor]]", "const c10::List<std::optional<at::Tensor>>&",
                          f"[{_T}, None]"),
    "int": TypeInfo("int", "int64_t", "2"),
    "int?": TypeInfo("Optional[int]", "std::optional<int64_t>", "2"),
    "int[]": TypeInfo("Sequence[int]", "at::IntArrayRef", "[1, 2]"),
    "int[]?": TypeInfo("Optional[Sequence[int]]", "at::OptionalIntArrayRef", "[1, 2]"),
    "SymInt": TypeInfo("int", "c10::SymInt", "2"),
    "SymInt?": TypeInfo("Optional[int]", "std::optional<c10::SymInt>", "2"),
    "SymInt[]": TypeInfo("Sequence[int]", "c10::SymIntArrayRef", "[1, 2]"),
    "float": TypeInfo("float", "double", "0.5"),
    "float?": TypeInfo("Optional[float]", "std::optional<double>", "0.5"),
    "float[]": TypeInfo("Sequence[float]", "at::ArrayRef<double>", "[0.5, 1.5]"),
    "bool": TypeInfo("bool", "bool", "True"),
    "bool?": TypeInfo("Optional[bool]", "std::optional<bool>", "True"),
    "bool[]": TypeInfo("Sequence[bool]", None, "[True, False]"),
    "str": TypeInfo("str", "c10::string_view", '"mean"'),
    "str?": TypeInfo("Optional[str]", "std::optional<c10::string_view>", '"mean"'),
    "Scalar": TypeInfo("Number", "const at::Scalar&", "0.5"),
    "Scalar?": TypeInfo("Optional[Number]", "const std::optional<at::Scalar>&", "0.5"),
    "ScalarType": TypeInfo("torch.dtype", "at::ScalarType", "torch.float32"),
    "ScalarType?": TypeInfo("Optional[torch.dtype]", "std::optional<at::ScalarType>", "torch.float32"),
    "Device": TypeInfo("torch.device", "at::Device", 'torch.device("cpu")'),
    "Device?": TypeInfo("Optional[torch.device]", "std::optional<at::Device>", 'torch.device("cpu")'),
    "Layout": TypeInfo("torch.layout", "at::Layout", "torch.strided", custom_op=False),
    "Layout?": TypeInfo("Optional[torch.layout]", "std::optional<at::Layout>", "torch.strided", custom_op=False),
    "MemoryFormat": TypeInfo("torch.memory_format", "at::MemoryFormat", "torch.contiguous_format",
                             custom_op=False),
    "MemoryFormat?": TypeInfo("Optional[torch.memory_format]", "std::optional<at::MemoryFormat>",
                              "torch.contiguous_format", custom_op=False),
}

RETURN_PY = {"Tensor": "torch.Tensor", "Tensor[]": "list[torch.Tensor]"}
RETURN_CPP = {"Tensor": "at::Tensor", "Tensor[]": "std::vector<at::Tensor>"}


def py_return(returns: tuple[str, ...]) -> str:
    if not returns:
        return "None"
    if len(returns) == 1:
        return RETURN_PY[returns[0]]
    return f"tuple[{', '.join(RETURN_PY[r] for r in returns)}]"


def cpp_return(returns: tuple[str, ...]) -> str:
    if not returns:
        return "void"
    if len(returns) == 1:
        return RETURN_CPP[returns[0]]
    return f"std::tuple<{', '.join(RETURN_CPP[r] for r in returns)}>"


def typing_imports(annotations: list[str]) -> list[str]:
    """The import lines the given annotations need (Optional, Sequence, Number)."""
    text = " ".join(annotations)
    names = [n for n in ("Optional", "Sequence") if f"{n}[" in text]
    lines = [f"from typing import {', '.join(names)}"] if names else []
    if "Number" in text:
        lines.append("from torch.types import Number")
    return lines


def py_default(type_name: str, value: Any) -> str | None:
    """A parsed schema default as Python source; None when there is no spelling for it."""
    base = type_name.rstrip("?")
    if value is None:
        return "None"
    if base in ("ScalarType", "Layout", "MemoryFormat") and isinstance(value, int):
        enum = _dtypes_by_index() if base == "ScalarType" else _ENUM_DEFAULTS[base]
        return str(enum[value]) if value in enum else None  # parse_schema gives the enum's index
    if isinstance(value, (bool, int, float, str)):
        return repr(value)
    if isinstance(value, torch.device):
        return f'torch.device("{value}")'
    if isinstance(value, list):
        return repr(tuple(value))  # an immutable default
    return None


# The only Layout and MemoryFormat defaults the schema parser accepts.
_ENUM_DEFAULTS = {"Layout": {0: torch.strided}, "MemoryFormat": {0: torch.contiguous_format}}


@functools.cache
def _dtypes_by_index() -> dict[int, torch.dtype]:
    result = {}
    for dtype in (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32,
                  torch.int16, torch.int8, torch.uint8, torch.bool, torch.complex64, torch.complex128):
        schema = torch._C.parse_schema(f"f(ScalarType d={str(dtype).removeprefix('torch.')}) -> ()")
        result[schema.arguments[0].default_value] = dtype
    return result
