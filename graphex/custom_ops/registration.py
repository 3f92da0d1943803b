"""How a custom operator was registered: the style a fix must be written in, and where.

The three paths of the custom-op guide:
  custom_op  `@torch.library.custom_op("ns::op", ...)`     (fix: `@op.register_fake`)
  library    `torch.library.Library("ns", "FRAGMENT").define(...)` in Python
             (fix: `Library("ns", "IMPL", "Meta")` + `@impl(meta_lib, "op")`)
  cpp        `TORCH_LIBRARY(ns, m) { m.def(...); }` in C++
             (fix: `TORCH_LIBRARY_IMPL(ns, Meta, m)`, or a Python Meta as in the op-plugin style)
"""

from __future__ import annotations

import dataclasses
import re

import torch

_DEFINED_AT = re.compile(r"^debug: registered at (?P<where>.+)$", re.MULTILINE)


@dataclasses.dataclass(frozen=True)
class Registration:
    qualname: str          # "mylib::rms_norm"
    overload: str          # "default" or the overload name
    style: str             # "custom_op" | "library" | "cpp"
    defined_at: str        # "model.py:12", "ops.cpp:40", or "" when unknown
    python_name: str       # the decorated function's name (custom_op), else the op name
    schema: torch._C.FunctionSchema

    @property
    def namespace(self) -> str:
        return self.qualname.split("::", 1)[0]

    @property
    def name(self) -> str:
        return self.qualname.split("::", 1)[1]

    def where(self) -> str:
        return f" (defined at {self.defined_at})" if self.defined_at else ""


def describe(op: torch._ops.OpOverload) -> Registration:
    qualname = op._schema.name
    python_name = qualname.split("::", 1)[1]
    from torch._library.custom_ops import OPDEFS

    defined_at = _defined_at(op)
    opdef = OPDEFS.get(qualname)
    if opdef is not None:
        init_fn = getattr(opdef, "_init_fn", None)
        if init_fn is not None:
            python_name = init_fn.__name__
            code = getattr(init_fn, "__code__", None)
            if code is not None:
                defined_at = f"{code.co_filename}:{code.co_firstlineno}"
        style = "custom_op"
    elif defined_at.split(":", 1)[0].endswith((".cpp", ".cc", ".cxx", ".cu", ".h", ".hpp")):
        style = "cpp"
    else:
        style = "library"
    return Registration(qualname, op._overloadname, style, defined_at, python_name, op._schema)


def _defined_at(op: torch._ops.OpOverload) -> str:
    try:
        dump = torch._C._dispatch_dump(op.name())
    except RuntimeError:
        return ""
    m = _DEFINED_AT.search(dump)
    return m["where"].strip() if m else ""


def is_custom(op: object) -> bool:
    """A user operator (not aten/prims/a torch-internal namespace)."""
    if not isinstance(op, torch._ops.OpOverload):
        return False
    from torch._library.utils import is_builtin

    if is_builtin(op):
        return False
    return op.namespace not in ("prims", "_c10d_functional", "c10d_functional", "_dtensor", "higher_order",
                                "inductor", "quantized", "_quantized", "profiler", "debugprims", "rngprims")
