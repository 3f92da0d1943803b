"""Dynamo's guard sources as typed paths: parsed with `ast` from a small grammar, never evaluated, and resolved in
this process (Note [cache_compile keys on what the trace read], graphex/inference/guards.py)."""

from __future__ import annotations

import ast
import builtins
import contextvars
import importlib
import keyword
import sys
from typing import Any, Callable


class NotCheckable(Exception):
    """A guard that a cache entry cannot check in another process; the message names it."""

# A path is a root and steps: ("L", name) or ("G", name), then ("attr", name), ("item", key), ("type",),
# ("key", i) (the i-th key of a dict: Dynamo's `list(dict.keys(x))[i]`), ("dict",) (`dict(x)`, of a class's
# __dict__), ("item_at", path) (`x[<the object at path>]`), ("dict_item", k) / ("dict_item_at", path)
# (`dict.__getitem__(x, k)`), ("cv_get", (has_default, default)) (`x.get()` of a ContextVar, torch 2.15).
Path = tuple[tuple[Any, ...], ...]


def parse_source(name: str) -> Path:
    """Dynamo's source name as a path, or NotCheckable. Never evaluates `name`."""
    try:
        tree = ast.parse(name, mode="eval").body
    except SyntaxError:
        raise NotCheckable(f"source {name!r} is not an access path") from None
    steps: list[tuple[Any, ...]] = []

    def walk(node: ast.AST) -> None:
        if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) and node.value.id in ("L", "G") \
                and isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, str):
            steps.append((node.value.id, node.slice.value))
        elif isinstance(node, ast.Attribute):
            walk(node.value)
            if not node.attr.isidentifier() or keyword.iskeyword(node.attr):
                raise NotCheckable(f"source {name!r}: attribute {node.attr!r}")
            steps.append(("attr", node.attr))
        elif isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) \
                and type(node.slice.value) in (int, str, bytes):
            if _is_dict_keys(node.value):
                walk(node.value.args[0].args[0])  # type: ignore[attr-defined]
                if type(node.slice.value) is not int:
                    raise NotCheckable(f"source {name!r}: a dict key by a non-int index")
                steps.append(("key", node.slice.value))
            else:
                walk(node.value)
                steps.append(("item", node.slice.value))
        elif isinstance(node, ast.Subscript) and not isinstance(node.slice, (ast.Constant, ast.UnaryOp)):
            walk(node.value)  # a dict item keyed by an object read through another path (a class, a key)
            steps.append(("item_at", parse_source(ast.unparse(node.slice))))
        elif isinstance(node, ast.Subscript) and isinstance(node.slice, ast.UnaryOp) \
                and isinstance(node.slice.op, ast.USub) and isinstance(node.slice.operand, ast.Constant) \
                and type(node.slice.operand.value) is int:
            walk(node.value)
            steps.append(("item", -node.slice.operand.value))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "__getitem__" \
                and isinstance(node.func.value, ast.Name) and node.func.value.id == "dict" and len(node.args) == 2 \
                and not node.keywords:
            walk(node.args[0])  # dict.__getitem__(x, key): the dict's own item, past a subclass's __getitem__
            key = node.args[1]
            if isinstance(key, ast.Constant) and type(key.value) in (int, str):
                steps.append(("dict_item", key.value))
            else:
                steps.append(("dict_item_at", parse_source(ast.unparse(key))))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr == "__getattribute__" and isinstance(node.func.value, ast.Name) \
                and node.func.value.id == "object" and len(node.args) == 2 and not node.keywords \
                and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str):
            walk(node.args[0])  # object.__getattribute__(x, 'name'): past a class's own __getattr__ (torch 2.12)
            steps.append(("object_attr", node.args[1].value))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get" \
                and len(node.args) <= 1 and not node.keywords \
                and all(isinstance(a, ast.Constant) and type(a.value) in _CONSTANT_TYPES for a in node.args):
            walk(node.func.value)  # Note [A ContextVar is read by its get()]
            steps.append(("cv_get", (bool(node.args), node.args[0].value if node.args else None)))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("type", "dict") \
                and len(node.args) == 1 and not node.keywords:
            walk(node.args[0])
            steps.append((node.func.id,))
        else:
            raise NotCheckable(f"source {name!r} is not an access path graphex can check ({ast.dump(node)[:80]})")

    walk(tree)
    return tuple(steps)


def _is_dict_keys(node: ast.AST) -> bool:
    """`list(dict.keys(x))`."""
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "list"
            and len(node.args) == 1 and isinstance(node.args[0], ast.Call)
            and isinstance(node.args[0].func, ast.Attribute) and node.args[0].func.attr == "keys"
            and isinstance(node.args[0].func.value, ast.Name) and node.args[0].func.value.id == "dict"
            and len(node.args[0].args) == 1)


_MISSING = object()


def resolve_global(name: str, globals_: dict[str, Any]) -> Any:
    """A `G[name]` root: Dynamo's injected names (`__import_a_dot_b` for module a.b, `__builtins_dict___N`)
    or a global of the traced frame (graphex/inference/capture.py's `flat_call`)."""
    if name.startswith("__import_"):
        module = name[len("__import_"):].replace("_dot_", ".")
        found = sys.modules.get(module, _MISSING)
        if found is _MISSING and module.startswith("torch."):
            # A module of torch's that the trace read and this process has not imported yet: one of Dynamo's
            # polyfills (torch.distributions' code, an argument pytree rebuilds), which a cache hit does not import
            # by itself (Note [A cache hit imports no compiler]). Importing it gives what the check expects unless someone changed it, as in the
            # process that traced; other modules are never imported here (a missing one fails the guard).
            found = importlib.import_module(module)
        return found
    if name.startswith("__builtins_dict__"):
        return builtins.__dict__
    return globals_.get(name, _MISSING)


def contextvar_get(var: Any, arg: tuple[bool, Any]) -> Any:
    """`var.get()` / `var.get(default)`, only of a ContextVar (anything else is not read: TypeError).

    Note [A ContextVar is read by its get()]
    Since torch 2.15 Dynamo traces `ContextVar.get()` (torch's config module keeps a user's override
    of each option in one: `torch.compiler.config._config[name].user_override`) and guards the
    ContextVar by identity and what get() returned, under the source `<the var>.get()`. A cache entry
    records both: the ContextVar by its name at that path (identity()), and get()'s value, read
    again on every call; a path step of its own, never pinned by a dict watch, since set() changes
    it without touching any dict."""
    if type(var) is not contextvars.ContextVar:
        raise TypeError(f"{type(var).__qualname__} is not a ContextVar")
    has_default, default = arg
    return var.get(default) if has_default else var.get()

# One table for both readers of a path: `resolve` (here, now) and the generated check (_Emitter.var):
# step kind -> (how to read it, the code that reads it; `{b}` the base, `{a}` the argument).
_STEPS: dict[str, tuple[Callable[[Any, Any], Any], str]] = {
    "attr": (getattr, "{b}.{a}"),
    "item": (lambda v, a: v[a], "{b}[{a!r}]"),
    "type": (lambda v, a: type(v), "type({b})"),
    "dict": (lambda v, a: dict(v), "dict({b})"),
    "dict_item": (dict.__getitem__, "dict.__getitem__({b}, {a!r})"),
    "object_attr": (object.__getattribute__, "object.__getattribute__({b}, {a!r})"),
    "key": (lambda v, a: list(dict.keys(v))[a], "list(dict.keys({b}))[{a!r}]"),
    "item_at": (lambda v, a: v[a], "{b}[{a}]"),
    "dict_item_at": (dict.__getitem__, "dict.__getitem__({b}, {a})"),
    "cv_get": (contextvar_get, "cv_get({b}, {a!r})"),
}


_KEYED_BY_PATH = {"item_at", "dict_item_at"}  # the argument is itself a path, read first


def resolve(path: Path, locals_: dict[str, Any], globals_: dict[str, Any]) -> Any:
    """The value at `path` now, or _MISSING."""
    kind, name = path[0]
    value = locals_.get(name, _MISSING) if kind == "L" else resolve_global(name, globals_)
    try:
        for step in path[1:]:
            if value is _MISSING:
                return _MISSING
            read, _ = _STEPS[step[0]]
            arg = step[1] if len(step) > 1 else None
            if step[0] in _KEYED_BY_PATH:
                arg = resolve(arg, locals_, globals_)
                if arg is _MISSING:
                    return _MISSING
            value = read(value, arg)
    except (AttributeError, LookupError, TypeError):  # LookupError: KeyError, IndexError, an unset ContextVar
        return _MISSING
    return value


_CONSTANT_TYPES = (int, float, bool, str, bytes, type(None))
