"""How a custom operator was registered: the style a fix must be written in, and where.

The three paths of the custom-op guide:
  custom_op  `@torch.library.custom_op("ns::op", ...)`     (fix: `@op.register_fake`)
  library    `torch.library.Library("ns", "FRAGMENT").define(...)` in Python
             (fix: `@impl(LIB, "op", "Meta")` on the namespace's one Library, fixes.namespace_library)
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


# Note [A Meta registration that vanished]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# A torch.library.Library unregisters everything registered on it when it is
# garbage-collected. The op-plugin blocks of the npugraph_ex template each say
# `m = Library("npu", "IMPL", "Meta")`; pasted one after the other, the second
# rebinds `m`, the first Library is collected and its Meta function is gone
# without a word. Nothing in torch remembers it, so graphex reads the user's
# source: when an op has no Meta kernel but a file of the program decorates a
# function with `impl(VAR, "op")` where VAR is assigned a
# `Library("ns", "IMPL", "Meta")`, the missing-fake error says the registration
# vanished and why (a later assignment to VAR, if any), instead of proposing
# a new Meta function the user already wrote.
@dataclasses.dataclass(frozen=True)
class VanishedMeta:
    where: str       # "model.py:31": the registration that no longer holds
    var: str         # the name the Library was bound to
    rebound: str     # "model.py:40" where that name gets another Library, or ""
    function: str = ""  # the source of the Meta function it decorates, without its decorators ("" if not found)


def vanished_meta(reg: Registration) -> VanishedMeta | None:
    if reg.style == "custom_op" or torch._C._dispatch_has_kernel_for_dispatch_key(
            f"{reg.qualname}.{reg.overload}" if reg.overload not in ("", "default") else reg.qualname, "Meta"):
        return None
    names = {reg.name, f"{reg.name}.{reg.overload}"}
    for path in _program_files(reg):
        found = _find_meta_registration(path, reg.namespace, names)
        if found is not None:
            return found
    return None


def _program_files(reg: Registration) -> list[str]:
    """Python files of the user's program: where the op is defined, __main__, the frames now running."""
    import os
    import sys

    candidates = [reg.defined_at.rsplit(":", 1)[0]] if reg.defined_at else []
    main = getattr(sys.modules.get("__main__"), "__file__", None)
    if main:
        candidates.append(main)
    frame = sys._getframe(1)
    while frame is not None:
        candidates.append(frame.f_code.co_filename)
        frame = frame.f_back
    skip = (os.path.dirname(torch.__file__), os.path.dirname(os.path.dirname(__file__)))
    seen: list[str] = []
    for path in candidates:
        path = os.path.abspath(path)
        if path.endswith(".py") and os.path.isfile(path) and not path.startswith(skip) and path not in seen:
            seen.append(path)
    return seen


def _find_meta_registration(path: str, namespace: str, names: set[str]) -> VanishedMeta | None:
    import ast
    import os

    try:
        with open(path, encoding="utf-8") as f:
            source = f.read()
        tree = ast.parse(source, path)
    except (OSError, SyntaxError, ValueError):
        return None
    meta_libs: dict[str, list[int]] = {}   # var -> lines where it is assigned a Meta Library of `namespace`
    assigned: dict[str, list[int]] = {}    # var -> every line where it is assigned
    registered: list[tuple[str, int]] = []  # (var, line) of impl(var, "op")
    decorated: dict[int, ast.AST] = {}     # line of a decorator call -> the function it decorates
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    assigned.setdefault(target.id, []).append(node.lineno)
                    if _is_meta_library(node.value, namespace):
                        meta_libs.setdefault(target.id, []).append(node.lineno)
        if isinstance(node, ast.Call):
            var = _impl_target(node, names)
            if var is not None:
                registered.append((var, node.lineno))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for d in node.decorator_list:
                decorated[d.lineno] = node
    base = os.path.basename(path)
    for var, line in registered:
        if var in meta_libs:
            later = [n for n in assigned.get(var, []) if n > line]
            fn = decorated.get(line)
            function = ""
            if fn is not None:  # from the def line (decorators left out) to its end, dedented
                lines = source.splitlines()[fn.lineno - 1:fn.end_lineno]
                indent = len(lines[0]) - len(lines[0].lstrip())
                function = "\n".join(text[indent:] for text in lines)
            return VanishedMeta(f"{base}:{line}", var, f"{base}:{later[0]}" if later else "", function)
    return None


def defining_library(reg: Registration) -> str | None:
    """The name the user's code binds the Library that defines `reg` to: VAR in `VAR.define("op(...")`, with VAR
    assigned a `Library("ns", ...)` of the op's namespace where the file assigns it one (None if not found)."""
    for path in _program_files(reg):
        found = _find_define(path, reg.namespace, {reg.name, f"{reg.name}.{reg.overload}"})
        if found is not None:
            return found
    return None


def _find_define(path: str, namespace: str, names: set[str]) -> str | None:
    import ast

    try:
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), path)
    except (OSError, SyntaxError, ValueError):
        return None
    libraries: dict[str, set[str]] = {}  # var -> the namespaces of the Libraries assigned to it
    defines: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
            ns = _library_namespace(node.value)
            for target in node.targets:
                if ns is not None and isinstance(target, ast.Name):
                    libraries.setdefault(target.id, set()).add(ns)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "define" \
                and isinstance(node.func.value, ast.Name) and node.args and isinstance(node.args[0], ast.Constant) \
                and isinstance(node.args[0].value, str) and node.args[0].value.split("(", 1)[0].strip() in names:
            defines.append(node.func.value.id)
    for var in defines:
        if namespace in libraries.get(var, {namespace}):
            return var
    return None


def _library_namespace(call: object) -> str | None:
    """"ns" for a `Library("ns", ...)` / `torch.library.Library("ns", ...)` call, else None."""
    import ast

    func = call.func  # type: ignore[attr-defined]
    name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
    args = call.args  # type: ignore[attr-defined]
    if name == "Library" and args and isinstance(args[0], ast.Constant) and isinstance(args[0].value, str):
        return args[0].value
    return None


def _is_meta_library(value: object, namespace: str) -> bool:
    import ast

    if not isinstance(value, ast.Call):
        return False
    func = value.func
    name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
    consts = [a.value for a in value.args if isinstance(a, ast.Constant)]
    return name == "Library" and consts[:1] == [namespace] and "Meta" in consts[1:]


def _impl_target(call: object, names: set[str]) -> str | None:
    """VAR for `impl(VAR, "op")` / `torch.library.impl(VAR, "op")` / `VAR.impl("op", ...)`."""
    import ast

    func = call.func  # type: ignore[attr-defined]
    args = call.args  # type: ignore[attr-defined]
    if isinstance(func, ast.Attribute) and func.attr == "impl" and isinstance(func.value, ast.Name) \
            and args and isinstance(args[0], ast.Constant) and args[0].value in names:
        return func.value.id
    is_impl = (isinstance(func, ast.Name) and func.id == "impl") or (
        isinstance(func, ast.Attribute) and func.attr == "impl")
    if is_impl and len(args) >= 2 and isinstance(args[0], ast.Name) and isinstance(args[1], ast.Constant) \
            and args[1].value in names:
        return args[0].id
    return None
