"""What a cache entry's trace read, as Dynamo guarded it: recorded at compile, checked before every replay.

Note [cache_compile keys on what the trace read]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
Dynamo records every piece of Python state a trace depended on as a guard: a module attribute
read (`self.scale == 2.0`), a config object's field, a dict's value, the function stored on a
module (`self.fn is torch.tanh`), a global, the type of every object walked through, the
hooks dicts of every submodule, the global torch state. Keying the cache on a list of things
we thought of missed each one we did not (three rounds of stale results); Dynamo's list is
what the trace actually read. So:

  * at compile (capture.py), a `guard_filter_fn` (torch.compile's public option) sees every
    guard with its source (an access path such as `L['func'].__self__.cfg.mult`) and the value
    found there; `record` turns each into a typed record {kind, source, expect, arg}, with the
    value fingerprinted portably (constants by value, types, modules, classes and functions by
    qualified name, functions also by their code). A guard that cannot be checked from another
    process (an object by identity, a weak reference, a dict version, an unknown guard type)
    makes the entry uncacheable, logged with the guard; the call still runs compiled.
  * at load (cache_compile.py), `GuardSet.bind` resolves every source again in this process
    and compares fingerprints: a mismatch is a miss naming the guard, never a stale hit. What
    it found (the type, the module, the function's code object) is then held, and one check
    function is generated from the typed records, run before every replay: identity and type
    by `is`, constants by type and value, lengths, hooks dicts empty, the global state through
    torch's own GlobalStateGuard. A change after the first call (`m.scale = 3.0`,
    `m.proj = nn.Linear(...)`, `m.fn = torch.relu`) fails it, and the call recompiles.

A source is parsed with `ast` and interpreted from a small grammar (a root `L[...]` or `G[...]`,
attributes, constant subscripts, `type(x)`, `list(dict.keys(x))[i]`); the check function is
generated from the parsed records only: names checked as identifiers, constants written with
`repr` of ints and strings. Nothing read from a cache file is evaluated as it is.

Left out, with their reasons: guards on `L['in_spec']` (the call's argument structure: the
entry is found by exactly that structure, so they hold by construction); TENSOR_MATCH on a
graph input (the engine checks dtype, shape, stride and device of every input on every call,
Note [Entries are found by signature, not by exceptions]); GRAD_MODE and
DETERMINISTIC_ALGORITHMS (part of GLOBAL_STATE); SHAPE_ENV (Note [A dynamic entry carries its
shape guards]); the thread count in GLOBAL_STATE (it changes inductor's code, not the ATen
program graphex replays).
"""

from __future__ import annotations

import ast
import builtins
import collections
import contextvars
import enum
import os
import hashlib
import keyword
import sys
import types
from typing import Any, Callable

import torch

from ..program import Binding

GUARD_FORMAT = 1  # the record layout below; a new kind or field means a new number


class NotCheckable(Exception):
    """A guard that a cache entry cannot check in another process; the message names it."""


# -- sources ---------------------------------------------------------------------------------------
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
        return sys.modules.get(name[len("__import_"):].replace("_dot_", "."), _MISSING)
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


# -- fingerprints --------------------------------------------------------------------------------
_CONSTANT_TYPES = (int, float, bool, str, bytes, type(None))


def constant(value: Any) -> Any:
    """A JSON rendering of a constant that compares exactly (floats by hex), or NotCheckable."""
    t = type(value)
    if t in (int, bool, str, type(None)):
        return [t.__name__, value]
    if t is float:
        return ["float", value.hex()]
    if t is bytes:
        return ["bytes", value.hex()]
    if t in (tuple, list, frozenset) and len(value) <= 64:
        items = sorted(value, key=repr) if t is frozenset else value
        return [t.__name__, [constant(v) for v in items]]
    if t is torch.dtype:
        return ["dtype", str(value)]
    if t is torch.device:
        return ["device", str(value)]
    if isinstance(value, torch.Size):
        return ["Size", list(value)]
    raise NotCheckable(f"a constant of type {t.__qualname__}")


def from_constant(rendered: Any) -> Any:
    kind, v = rendered
    if kind in ("int", "bool", "str", "NoneType"):
        return v
    if kind == "float":
        return float.fromhex(v)
    if kind == "bytes":
        return bytes.fromhex(v)
    if kind in ("tuple", "list", "frozenset"):
        return {"tuple": tuple, "list": list, "frozenset": frozenset}[kind](from_constant(x) for x in v)
    if kind == "dtype":
        return getattr(torch, v.removeprefix("torch."))
    if kind == "device":
        return torch.device(v)
    if kind == "Size":
        return torch.Size(v)
    raise ValueError(f"unknown constant kind {kind!r}")


def _code_digest(code: types.CodeType) -> str:
    h = hashlib.sha256()

    def add(c: types.CodeType) -> None:
        h.update(c.co_code)
        h.update(repr((c.co_qualname, c.co_names, c.co_varnames, c.co_freevars, c.co_argcount,
                       c.co_kwonlyargcount, c.co_flags)).encode())
        for k in c.co_consts:
            if isinstance(k, types.CodeType):
                add(k)
            else:
                h.update(_stable_repr(k).encode())

    add(code)
    return h.hexdigest()[:32]


def _stable_repr(k: Any) -> str:
    """repr, but the same in every process: a frozenset constant (`x in {"a", "b"}`) iterates in an order that
    depends on string hashing, which Python randomizes per process."""
    if isinstance(k, (frozenset, set)):
        return "frozenset(" + ",".join(sorted(_stable_repr(x) for x in k)) + ")"
    if isinstance(k, tuple):
        return "(" + ",".join(_stable_repr(x) for x in k) + ")"
    return repr(k)


def identity(value: Any) -> Any:
    """What an object compared by identity is, portably: a module by name, a class or function by qualified
    name (a Python function also by its code), a singleton by value; NotCheckable for anything else."""
    if value is None or value is True or value is False or value is Ellipsis or value is NotImplemented:
        return ["singleton", repr(value)]
    if isinstance(value, types.ModuleType):
        return ["module", value.__name__]
    if isinstance(value, type):
        return ["class", value.__module__, value.__qualname__]
    if isinstance(value, types.FunctionType):
        return ["function", value.__module__, value.__qualname__, _code_digest(value.__code__)]
    if isinstance(value, types.CodeType):
        return ["code", value.co_qualname, _code_digest(value)]
    if isinstance(value, (types.BuiltinFunctionType, types.BuiltinMethodType, types.WrapperDescriptorType,
                          types.MethodDescriptorType, types.MethodWrapperType, types.ClassMethodDescriptorType)):
        owner = getattr(value, "__self__", None)
        where = owner.__name__ if isinstance(owner, (types.ModuleType, type)) else (
            getattr(value, "__module__", None) or type(owner).__qualname__)
        return ["builtin", where, getattr(value, "__qualname__", getattr(value, "__name__", "?"))]
    if isinstance(value, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
        return ["op", str(value)]
    if isinstance(value, torch.dtype):
        return ["dtype", str(value)]
    if isinstance(value, enum.Enum):
        return ["enum", type(value).__module__, type(value).__qualname__, value.name]
    if type(value).__name__ == "ProcessGroup" and hasattr(value, "group_name"):
        # by its name (Note [A program belongs to its world], graphex/distributed.py: the key holds the world)
        return ["process_group", value.group_name, value.size()]
    if type(value) is contextvars.ContextVar:  # Note [A ContextVar is read by its get()]: by name, at its path
        return ["contextvar", value.name]
    if type(value) is object:  # a sentinel (`_UNSET = object()`): by the module global that holds it
        where = _module_global(value)
        if where is not None:
            return ["global", *where]
    raise NotCheckable(f"an object of type {type(value).__qualname__} compared by identity, which another "
                       "process cannot check")


def _module_global(value: Any) -> tuple[str, str] | None:
    """(module, name) of the first loaded module (by name) whose global `name` is `value`, or None.

    Note [A sentinel is the module global that holds it]
    A bare `object()` has no name of its own; torch's config module returns one (`_UNSET_SENTINEL`)
    from a ContextVar's get() when no override is set, and Dynamo guards it by identity. The same
    object in another process is the one the same module global holds, so that is its fingerprint,
    and a loaded entry finds it there again and compares by identity."""
    for mod_name in sorted(m for m in list(sys.modules) if isinstance(m, str)):
        mod = sys.modules.get(mod_name)
        found = getattr(mod, "__dict__", None) if isinstance(mod, types.ModuleType) else None
        if isinstance(found, dict):
            for name, v in list(found.items()):
                if v is value and isinstance(name, str):
                    return mod_name, name
    return None


def type_name(t: type) -> list[str]:
    """A type by qualified name and, for a class of the user's, by what its class bodies hold.

    Note [A user's class is fingerprinted by its contents]
    Dynamo guards an object's type by identity and reads a method through the type without a
    guard of its own (`self.helper(x)`: TYPE_MATCH on self, `helper` not in its instance dict).
    In one process that type object is the one traced; in another, `Model.helper = b.helper`
    could have been assigned to the class from a module whose file the trace never read. So a
    class defined in Python (the user's, a library's or torch's: any of them can be patched, and a
    library that patches `torch.nn.Linear.forward` at import changes what a trace of it does) is
    named with a digest of every attribute its MRO's Python classes define: functions by module,
    name and code, plain values by value, anything else by its type. Checked when an entry is
    loaded and, in the same process, whenever one of those class dicts changed (_ClassUnchanged)."""
    return [t.__module__, t.__qualname__] + ([_class_digest(t)] if _is_mutable_class(t) else [])


def _is_mutable_class(t: type) -> bool:
    """A class whose body can be changed by assignment: every Python-defined class, the user's, a library's
    and torch's alike (`torch.nn.Linear.forward = ...`, `torch.Tensor.softmax = ...`, done by a library at
    import, is no less a change than the user's own). Builtin and extension types are immutable."""
    return not t.__flags__ & _IMMUTABLE_TYPE and t.__module__ != "builtins"


def _class_digest(t: type) -> str:
    h = hashlib.sha256()
    for cls in t.__mro__:
        if not _is_mutable_class(cls):
            continue
        h.update(f"{cls.__module__}.{cls.__qualname__}".encode())
        for name, value in sorted(vars(cls).items()):
            if name in ("__dict__", "__weakref__", "__doc__", "__module__", "__qualname__") or name.startswith("___"):
                continue  # `___x`: Dynamo's own markers (torch/_dynamo/mutation_guard.py)
            h.update(name.encode())
            target = _unpatched(getattr(value, "__func__", value))  # classmethod / staticmethod
            if isinstance(target, types.FunctionType):
                h.update(f"{target.__module__}.{target.__qualname__}:{_code_digest(target.__code__)}".encode())
            elif isinstance(target, property):
                for f in (target.fget, target.fset):
                    if isinstance(f, types.FunctionType):
                        h.update(_code_digest(f.__code__).encode())
            elif type(value) in _CONSTANT_TYPES:
                h.update(repr(value).encode())
            else:
                h.update(f"{type(value).__module__}.{type(value).__qualname__}".encode())
    return h.hexdigest()[:24]


def global_state() -> dict[str, Any]:
    """The global torch state a trace runs under, as GLOBAL_STATE records it (less the thread count)."""
    return _global_state()


def _global_state() -> dict[str, Any]:
    import json

    state = json.loads(torch._C._dynamo.guards.GlobalStateGuard().__getstate__())
    state.pop("num_threads", None)  # Note [cache_compile keys on what the trace read]: not the program's
    return state


def _saved_tensors_hooks() -> Any:
    return torch._functorch._aot_autograd.utils.top_saved_tensors_hooks()


# -- recording (compile time) ---------------------------------------------------------------------
_STATE_KINDS = {"GLOBAL_STATE": "global_state", "TORCH_FUNCTION_STATE": "torch_function",
                "DEFAULT_DEVICE": "default_device", "AUTOGRAD_SAVED_TENSORS_HOOKS": "saved_tensors_hooks"}
_SKIPPED = {"GRAD_MODE", "DETERMINISTIC_ALGORITHMS", "SHAPE_ENV"}
_IDENTITY = {"ID_MATCH", "BUILTIN_MATCH", "FUNCTION_MATCH", "CLASS_MATCH", "MODULE_MATCH", "NN_MODULE",
             "NONE_MATCH", "BOOL_MATCH"}


def record(entries: list[Any], *, input_sources: set[str], locals_: dict[str, Any],
           globals_: dict[str, Any], global_state: dict[str, Any] | None = None,
           traced_code: list[types.CodeType] | None = None) -> list[dict[str, Any]]:
    """Dynamo's GuardFilterEntry list as typed records (Note [cache_compile keys on what the trace read]).
    `input_sources`: the source names of the graph's inputs (their tensors are checked by the engine);
    `locals_`, `globals_`: the traced frame's, to check that every source reads the object Dynamo saw;
    `global_state`: _global_state() as the call began (Dynamo builds guards with torch functions disabled)."""
    out: list[dict[str, Any]] = []
    seen: set[str] = set()
    for e in entries:  # Note [A global installed by id is found by what it is]
        name = getattr(e.orig_guard, "name", "")
        for root in _BY_ID.findall(name):
            if root not in seen and root in globals_:
                seen.add(root)
                out.append({"kind": "root", "name": root, "expect": identity(globals_[root])})
    out += _global_hooks_empty(globals_)
    reads_environ = False
    for e in entries:
        rec = _record_one(e, input_sources)
        if rec is not None and rec["kind"] == "reads_environ":
            reads_environ = True
            continue
        if rec is not None and rec["kind"] == "global_state" and global_state is not None:
            rec["expect"] = global_state  # the caller's, not the one Dynamo builds guards under
        if rec is not None and "source" in rec and e.has_value:
            # the object the guard saw is the one its own source names (torch 2.11's hasattr guard names `X.attr`
            # and the record checks X: the value is X.attr's)
            path = parse_source(e.orig_guard.name)
            now = resolve(path, locals_, globals_)
            # `dict(x)` is a new copy each time it is read, and so is a code object's `co_varnames` (Python 3.11;
            # torch 2.15 guards what traced code reads of a code object) and a bound method (`X.__iter__`, which
            # torch 2.11's hasattr guard names): equal, not identical
            fresh = path[-1] == ("dict",) or isinstance(now, types.MethodType) or (
                path[-1][0] == "attr" and str(path[-1][1]).startswith("co_")
                and isinstance(resolve(path[:-1], locals_, globals_), types.CodeType))
            if not (now == e.value if fresh else now is e.value):
                raise NotCheckable(f"graphex reads {rec['source']} as another object than Dynamo saw")
        if rec is None:
            continue
        key = repr(sorted(rec.items()))
        if key not in seen:
            seen.add(key)
            out.append(rec)
    if reads_environ:
        out.append(_environ_record(traced_code or []))
    return out


# Note [Environment variables are checked by name]
# A trace that reads os.environ (transformers reads TRANSFORMERS_SDPA_FORCE_GQA in every SDPA call)
# gets no guard on the variable from Dynamo, only on the mapping's type. graphex records the value
# (or absence) of every variable whose name is a string constant of the traced code (an
# upper-case identifier, as environment variables are named) and checks them on load and, through
# the watch on os.environ's own dict, whenever the environment changes in the process. A variable
# whose name the code computes is not seen; pass such a decision as an argument.
_ENV_NAME = __import__("re").compile(r"^[A-Z][A-Z0-9_]{2,}$")


def _environ_record(traced_code: list[types.CodeType]) -> dict[str, Any]:
    names: set[str] = set()

    def visit(code: types.CodeType) -> None:
        for k in code.co_consts:
            if isinstance(k, types.CodeType):
                visit(k)
            elif isinstance(k, str) and _ENV_NAME.match(k):
                names.add(k)

    for code in traced_code:
        visit(code)
    return {"kind": "environ", "source": "G['__import_os'].environ._data",
            "expect": {k: os.environ.get(k) for k in sorted(names)}}


_GLOBAL_HOOKS = ("_global_forward_hooks", "_global_forward_pre_hooks", "_global_backward_hooks",
                 "_global_backward_pre_hooks", "_global_forward_hooks_with_kwargs", "_global_forward_hooks_always_called")


def _global_hooks_empty(globals_: dict[str, Any]) -> list[dict[str, Any]]:
    """Records that torch.nn.modules.module's global hook dicts are still empty (register_module_forward_hook
    changes every module's result; Dynamo guards only their type). A trace with a global hook is not cached."""
    import torch.nn.modules.module as module_py

    root = "G['__import_torch_dot_nn_dot_modules_dot_module']"
    out = []
    for name in _GLOBAL_HOOKS:
        hooks = getattr(module_py, name, None)
        if hooks is None:
            continue
        if len(hooks):
            raise NotCheckable(f"a global nn.Module hook is registered (torch.nn.modules.module.{name})")
        out.append({"kind": "len", "source": f"{root}.{name}", "expect": [type_name(type(hooks)), 0]})
    return out


def _record_one(e: Any, input_sources: set[str]) -> dict[str, Any] | None:
    try:
        return _record_guard(e, input_sources)
    except NotCheckable as err:
        name = getattr(e.orig_guard, "name", "")
        if name and name not in str(err):  # say which guard: the source the trace read
            raise NotCheckable(f"{err} ({e.guard_type} guard on {name})") from None
        raise


def _record_guard(e: Any, input_sources: set[str]) -> dict[str, Any] | None:
    kind, guard = e.guard_type, e.orig_guard
    name = guard.name
    if kind in _SKIPPED:
        return None
    if kind in _STATE_KINDS:
        state = _STATE_KINDS[kind]
        if state == "global_state":
            return {"kind": state, "expect": _global_state()}
        if state == "torch_function":
            if torch._C._len_torch_function_stack() != 0:
                raise NotCheckable("the trace ran under a TorchFunctionMode")
            return {"kind": state}
        if state == "default_device":
            device = torch.utils._device.CURRENT_DEVICE
            return {"kind": state, "expect": None if device is None else str(device)}
        if _saved_tensors_hooks() is not None:
            raise NotCheckable("the trace ran under saved-tensors hooks")
        return {"kind": state}
    path = parse_source(name)
    if e.has_value and (e.value is os.environ or e.value is getattr(os.environ, "_data", None)):
        return {"kind": "reads_environ"}  # Note [Environment variables are checked by name]
    if path[0] == ("L", "in_spec") or path == (("L", "flat_args"),):
        return None  # Note [cache_compile keys on what the trace read]: the call's own structure
    keywords = getattr(guard.create_fn, "keywords", None) or {}
    if kind == "HASATTR" and "attr" not in keywords and path[-1][0] == "attr" and len(path) > 1 \
            and name.endswith("." + path[-1][1]):
        # torch 2.11: the guard names the attribute's own source (`X.attr`) and checks hasattr(X, 'attr');
        # since 2.12 it names X and passes attr. Recorded the same way for both.
        attr = _attr_name(path[-1][1], name)
        return {"kind": "hasattr", "source": name[:-len(attr) - 1], "arg": attr, "expect": bool(e.has_value)}
    if not e.has_value:
        raise NotCheckable(f"{kind} guard on {name} has no value")
    value = e.value
    rec: dict[str, Any] = {"kind": "", "source": name}
    if kind in ("TYPE_MATCH", "FAKE_SCRIPT_TYPE_MATCH"):  # the latter: a script object's (a process group's) type
        rec.update(kind="type", expect=type_name(type(value)))
    elif kind in _IDENTITY:
        rec.update(kind="id", expect=identity(value))
    elif kind == "CLOSURE_MATCH":
        if type(value) is types.FunctionType:
            rec.update(kind="code", expect=identity(value.__code__))
        else:
            rec.update(kind="id", expect=identity(value))
    elif kind in ("CONSTANT_MATCH", "EQUALS_MATCH") and isinstance(value, types.CodeType):
        rec.update(kind="id", expect=identity(value))  # a function's __code__ (CLOSURE_MATCH's own guard)
    elif kind in ("CONSTANT_MATCH", "EQUALS_MATCH"):
        rec.update(kind="equals", expect=constant(value))
    elif kind in ("SEQUENCE_LENGTH", "EMPTY_NN_MODULE_HOOKS_DICT", "LIST_LENGTH"):
        rec.update(kind="len", expect=[type_name(type(value)), len(value)])
    elif kind == "NOT_NONE_MATCH":
        rec.update(kind="not_none")
    elif kind == "NOT_PRESENT_IN_GENERIC_DICT":
        rec.update(kind="not_in_dict", arg=_attr_name(keywords.get("attr"), name))
    elif kind == "HASATTR":
        attr = _attr_name(keywords.get("attr"), name)
        rec.update(kind="hasattr", arg=attr, expect=hasattr(value, attr))
    elif kind in ("DICT_CONTAINS", "DICT_NOT_CONTAINS"):
        # torch 2.11 has no DICT_NOT_CONTAINS: DICT_CONTAINS(key, invert=True) checks the key is absent
        rec.update(kind="contains", arg=constant(keywords.get("key")),
                   expect=(kind == "DICT_CONTAINS") != bool(keywords.get("invert", False)))
    elif kind in ("DICT_KEYS_MATCH", "MAPPING_KEYS_CHECK", "DICT_KEYS"):
        rec.update(kind="keys", expect=[constant(k) for k in value.keys()])
    elif kind == "DUPLICATE_INPUT":
        other = keywords.get("source_b")
        rec.update(kind="same", arg=getattr(other, "name", other))
        parse_source(rec["arg"])
    elif kind == "OPAQUE_OBJ_GUARD_FN_MATCH":
        from .. import compat

        fn = compat.opaque_guard_fn(type(value))
        if fn is None:
            return None  # Dynamo adds no check either
        rec.update(kind="opaque", expect=constant(fn(value)))
    elif kind == "TENSOR_MATCH":
        if name in input_sources:  # the engine checks dtype, shape, strides, device; the Python type is ours
            rec.update(kind="type", expect=type_name(type(value)))
            return rec
        if not isinstance(value, torch.Tensor):
            raise NotCheckable(f"TENSOR_MATCH guard on {name} holds a {type(value).__qualname__}")
        rec.update(kind="tensor", expect=_tensor_meta(value))
    else:
        raise NotCheckable(f"Dynamo's {kind} guard on {name}")
    return rec


# Note [A global installed by id is found by what it is]
# Dynamo puts some objects the trace uses into the traced frame's globals under a name made of
# their id and the compile's number (`G['_140473466358656_c6']`), which no other process has.
# Such a root is recorded by what the object is (a module, class or function by qualified name,
# identity() above) and found again by that name in sys.modules when an entry is loaded.
_BY_ID = __import__("re").compile(r"G\['(_\d+_c\d+)'\]")


def _find_by_identity(fingerprint: Any) -> Any:
    """The live object an identity() fingerprint names, or _MISSING (modules must already be imported)."""
    kind = fingerprint[0]
    if kind == "module":
        return sys.modules.get(fingerprint[1], _MISSING)
    if kind == "global":  # Note [A sentinel is the module global that holds it]
        mod = sys.modules.get(fingerprint[1])
        found = getattr(mod, "__dict__", {}) if isinstance(mod, types.ModuleType) else {}
        return found.get(fingerprint[2], _MISSING) if isinstance(found, dict) else _MISSING
    if kind in ("class", "function", "enum"):
        obj: Any = sys.modules.get(fingerprint[1], _MISSING)
        for part in fingerprint[2].split("."):
            obj = getattr(obj, part, _MISSING) if obj is not _MISSING else _MISSING
        if kind == "enum" and obj is not _MISSING:
            obj = getattr(obj, fingerprint[3], _MISSING)
        if obj is not _MISSING:
            try:
                if identity(obj) != fingerprint:
                    return _MISSING
            except NotCheckable:
                return _MISSING
        return obj
    return _MISSING


def _attr_name(attr: Any, where: str) -> str:
    if not isinstance(attr, str) or not attr.isidentifier():
        raise NotCheckable(f"a guard on {where} names attribute {attr!r}")
    return attr


def _tensor_meta(t: torch.Tensor) -> list[Any]:
    return [type_name(type(t)), str(t.dtype), str(t.device), list(t.shape), list(t.stride()), t.requires_grad]


# -- checking (load time and every call) ---------------------------------------------------------------
class GuardSet:
    """The records of one entry. `bind` checks them in this process and builds `run`, called before each
    replay: `run(flat_args, func)` is the engine's input list when every guard holds, else None.

    Note [One function checks the guards and binds the inputs]
    The generated function checks the guards, then reads the program's inputs: arguments by
    position, sizes and strides of arguments, parameters and buffers through the source Dynamo read
    them from (`L['func'].__self__._modules['proj']._parameters['weight']`), so a submodule or
    parameter replaced after the first call is the one used. It has two paths:
      * full: every guard, every path read anew (common prefixes once per call);
      * fast, taken while a StateWatch (Note [A watched dict proves its guards still hold],
        csrc/python/state_watch.cpp) says that no dict the pinned guards read through has
        changed and no watched object changed its type: only the "always" guards (those that
        read through something no dict version covers), the arguments, and the parameters the
        full path read last time.
    Each full check takes a fresh watch's snapshot before it reads anything and publishes the pair
    (watch, parameters) only when it passes, so a change made at any moment, on any thread, is seen
    by the next call.
    """

    def __init__(self, records: list[dict[str, Any]]) -> None:
        self.records = records
        self.run: Callable[[Any, Any], list[Any] | None] | None = None
        self.source = ""
        self.count = len(records)
        self.always = 0  # records checked on every call (the rest: while the watch holds, by the watch)
        self._published: list[Any] = [(None, [])]

    @property
    def watch(self) -> Any:
        """The StateWatch of the last full check (tests, tools)."""
        return self._published[0][0]

    def bind(self, locals_: dict[str, Any], globals_: dict[str, Any],
             inputs: list[Binding] | None = None) -> str | None:
        """None when every record holds now (and `run` is built), else which guard fails and how."""
        held: list[Any] = []  # objects the generated code compares with
        pins = _Pins()
        full = _Emitter(held, pins, globals_)
        fast = _Emitter(held, pins, globals_)
        fast.on_fail = "return slow(flat_args, func)"  # the fast path proves; it never refuses
        always = 0
        try:
            for rec in self.records:
                kind = rec["kind"]
                if kind == "root":  # Note [A global installed by id is found by what it is]
                    obj = _find_by_identity(rec["expect"])
                    if obj is _MISSING:
                        return f"{_show(rec['expect'])} (a global the trace used) is not loaded in this process"
                    globals_ = full.globals_ = fast.globals_ = {**globals_, rec["name"]: obj}
                    continue
                if kind in ("global_state", "torch_function", "default_device", "saved_tensors_hooks"):
                    if not _state_holds(kind, rec.get("expect")):
                        return f"the global torch state differs ({kind})"
                    full.check(_state_check(kind, rec.get("expect"), held))
                    fast.check(_state_check(kind, rec.get("expect"), held, fast=True))
                    always += 1
                    continue
                path = parse_source(rec["source"])
                value = resolve(path, locals_, globals_)
                if value is _MISSING:
                    return f"{rec['source']} does not exist"
                cond, why = _condition(rec, value, full.var(path), held, locals_, globals_, full.var)
                if why is not None:
                    return f"{rec['source']}: {why}"
                full.check(cond)
                if not pins.covers(rec, path, value, locals_, globals_):
                    fast.check(_condition(rec, value, fast.var(path), held, locals_, globals_, fast.var)[0])
                    always += 1
            reads_full, reads_fast, static = [], [], []
            for i, b in enumerate(inputs or []):
                read = self._input(b, locals_, globals_, full.var)
                reads_full.append(read)
                if b.kind in ("param", "buffer") and pins.pinned(parse_source(b.source), locals_, globals_):
                    reads_fast.append(f"S[{len(static)}]")
                    static.append(i)
                else:
                    reads_fast.append(self._input(b, locals_, globals_, fast.var))
        except _Fails as e:
            return str(e)
        except Exception as e:  # noqa: BLE001  a record graphex did not write (a forged or damaged entry)
            return f"an unusable guard record ({type(e).__name__}: {e})"
        from .. import _C

        watched = (list(pins.dicts.values()), list(pins.objects.values()), list(pins.functions.values()))
        watch = _C.StateWatch(*watched)  # never snapshotted: the first call takes the full path
        # Note [One function checks the guards and binds the inputs]: P[0] is (watch, parameters) published as
        # one tuple after a full check that ran after the watch's snapshot, so a call on another thread sees
        # either the old pair (whose watch no longer holds after a change) or the new one, never a mix.
        source = (
            "def full(flat_args, func):\n  try:\n" + full.body() +
            f"\n    return [{', '.join(reads_full)}]\n  except Exception:\n    return None\n\n"
            "def run(flat_args, func):\n"
            "  W, S = P[0]\n"
            "  if W.unchanged():\n    try:\n" + fast.body(indent=6) +
            f"\n      return [{', '.join(reads_fast)}]\n    except Exception:\n      pass\n"
            "  return slow(flat_args, func)\n\n"
            "def slow(flat_args, func):\n"
            "  w = new_watch(*watched)\n"
            "  w.snapshot()\n"
            "  r = full(flat_args, func)\n"
            "  if r is None:\n    return None\n"
            f"  P[0] = (w, [r[i] for i in {tuple(static)!r}])\n"
            "  return r\n")
        namespace: dict[str, Any] = {"H": tuple(held), "P": [(watch, [])], "new_watch": _C.StateWatch,
                                     "watched": watched,
                                     "__builtins__": {"type": type, "len": len, "list": list, "dict": dict, "object": object,
                                                      "hasattr": hasattr, "float": float, "Exception": Exception,
                                                      "cv_get": contextvar_get}}
        exec(compile(source, "<graphex guards>", "exec"), namespace)  # generated from typed records only
        self._published = namespace["P"]
        self.run, self.source, self.always = namespace["run"], source, always
        return None

    @staticmethod
    def _input(binding: Binding, locals_: dict[str, Any], globals_: dict[str, Any],
               var: Callable[[Path], str]) -> str:
        """The expression that reads one program input (Note [A program input is bound by one typed Binding])."""
        kind = binding.kind
        if kind == "arg":
            return f"flat_args[{int(binding.index)!r}]"
        if kind in ("size", "stride"):
            return f"flat_args[{int(binding.index)!r}].{kind}({int(binding.dim)!r})"
        if kind == "storage_offset":
            return f"flat_args[{int(binding.index)!r}].storage_offset()"
        if kind in ("param", "buffer", "attr") and binding.source:  # attr: Note [A tensor an argument holds ...]
            path = parse_source(binding.source)
            if not isinstance(resolve(path, locals_, globals_), torch.Tensor):
                raise _Fails(f"the {kind} read from {binding.source} is gone")
            return var(path)
        raise NotCheckable(f"an input binding of kind {kind!r}")


class _Emitter:
    """Straight-line code for one path of the generated function: each path prefix read once, then checks."""

    def __init__(self, held: list[Any], pins: "_Pins", globals_: dict[str, Any]) -> None:
        self.held, self.pins, self.globals_ = held, pins, globals_
        self.lines: list[str] = []
        self.names: dict[Path, str] = {}
        self.on_fail = "return None"

    def check(self, cond: str) -> None:
        self.lines.append(f"if not ({cond}): {self.on_fail}")

    def body(self, indent: int = 4) -> str:
        return "\n".join(" " * indent + ln for ln in self.lines) if self.lines else " " * indent + "pass"

    def var(self, path: Path) -> str:
        if path in self.names:
            return self.names[path]
        if len(path) == 1:
            kind, name = path[0]
            if kind == "L":
                if name not in ("flat_args", "func"):
                    raise NotCheckable(f"local {name!r}")
                expr = name
            else:
                obj = resolve_global(name, self.globals_)
                if obj is _MISSING:
                    raise _Fails(f"global {name} is not defined in this process")
                expr = _hold(self.held, obj)
        else:
            base = self.var(path[:-1])
            step = path[-1]
            arg = step[1] if len(step) > 1 else None
            if step[0] in _KEYED_BY_PATH:
                arg = self.var(arg)
            elif step[0] == "key":
                arg = int(arg)
            expr = _STEPS[step[0]][1].format(b=base, a=arg)
        v = f"v{len(self.names)}"
        self.lines.append(f"{v} = {expr}")
        self.names[path] = v
        return v


_IMMUTABLE_TYPE = 1 << 8  # Py_TPFLAGS_IMMUTABLETYPE: a builtin or extension type no one can assign to
_WATCHED_VALUES = (int, float, bool, str, bytes, type(None), torch.dtype, torch.device, enum.Enum, types.CodeType,
                   types.FunctionType, types.BuiltinFunctionType, types.ModuleType, type)


class _Pins:
    """Which paths are pinned by watched dicts (Note [A watched dict proves its guards still hold]): a path is
    pinned when every step from a fixed root reads through a dict (collected in `dicts`) or something that
    cannot change (a bound method's __self__, a tuple item, an object's type: its object is then watched)."""

    def __init__(self) -> None:
        self.dicts: dict[int, dict[Any, Any]] = {}
        self.objects: dict[int, Any] = {}
        self.functions: dict[int, Any] = {}
        self._pinned: dict[Path, bool] = {}

    def _watch(self, d: Any) -> bool:
        if type(d) is not dict and not isinstance(d, dict):
            return False
        if type(d).__getitem__ is not dict.__getitem__ and type(d).__module__ != "collections":
            return False  # a dict subclass with its own lookup
        self.dicts[id(d)] = d
        return True

    def _watch_class(self, cls: type) -> None:
        for c in cls.__mro__:
            if not c.__flags__ & _IMMUTABLE_TYPE:
                real = _type_dict(c)
                if real is not None:
                    self.dicts[id(real)] = real

    def pinned(self, path: Path, locals_: dict[str, Any], globals_: dict[str, Any]) -> bool:
        if path in self._pinned:
            return self._pinned[path]
        result = self._pin(path, locals_, globals_)
        self._pinned[path] = result
        return result

    def _pin(self, path: Path, locals_: dict[str, Any], globals_: dict[str, Any]) -> bool:
        if len(path) == 1:
            return path[0] != ("L", "flat_args")  # func is this CachedFunction's own; G roots are held
        if not self.pinned(path[:-1], locals_, globals_):
            return False
        base = resolve(path[:-1], locals_, globals_)
        step = path[-1]
        if step[0] == "attr":
            name = step[1]
            if isinstance(base, types.MethodType) and name in ("__self__", "__func__"):
                return True
            if isinstance(base, property) and name in ("fget", "fset", "fdel"):
                return True  # a property object's functions are read-only
            if isinstance(base, types.ModuleType):
                return name in vars(base) and self._watch(vars(base))
            if isinstance(base, type):
                if name == "__dict__":
                    real = _type_dict(base)
                    if real is None:
                        return False
                    self.dicts[id(real)] = real
                    return True
                if type(base) is not type:  # a metaclass may compute attributes
                    return False
                self._watch_class(base)
                return any(name in vars(c) for c in base.__mro__)
            cls = type(base)
            own = getattr(base, "__dict__", None)
            if not isinstance(own, dict) or name not in own or cls.__getattribute__ is not object.__getattribute__:
                return False
            if any(name in vars(c) and hasattr(vars(c)[name], "__set__") for c in cls.__mro__):
                return False  # a data descriptor of the class wins over the instance dict
            self.objects[id(base)] = base
            self._watch_class(cls)
            return self._watch(own)
        if step[0] == "key" and isinstance(base, collections.OrderedDict):
            return False  # the i-th key of an OrderedDict changes with move_to_end, its dict version does not
        if step[0] in ("item", "dict_item", "key"):
            if isinstance(base, tuple) or path[-2] == ("dict",):
                return True  # a tuple cannot change; `dict(cls.__dict__)`'s class dict is watched already
            return self._watch(base)
        if step[0] in ("item_at", "dict_item_at"):
            return self.pinned(step[1], locals_, globals_) and self._watch(base)
        if step[0] == "type":
            self.objects[id(base)] = base
            return True
        if step[0] == "dict":  # `dict(cls.__dict__)`: the class dict was watched at `__dict__`
            return isinstance(base, types.MappingProxyType) and path[-2] == ("attr", "__dict__")
        return False

    def covers(self, rec: dict[str, Any], path: Path, value: Any, locals_: dict[str, Any],
               globals_: dict[str, Any]) -> bool:
        """Whether the watch proves `rec` while it holds (then the fast path skips it)."""
        if not self.pinned(path, locals_, globals_):
            return False
        kind = rec["kind"]
        if kind == "type":
            self.objects[id(value)] = value
            if _is_mutable_class(type(value)):
                self._watch_class(type(value))
            return True
        if kind in ("id", "same"):
            return kind == "id" or self.pinned(parse_source(rec["arg"]), locals_, globals_)
        if kind == "equals":
            return isinstance(value, _WATCHED_VALUES) or (type(value) is tuple and all(
                isinstance(v, _WATCHED_VALUES) for v in value))
        if kind in ("len", "contains"):
            return isinstance(value, tuple) or self._watch(value)
        if kind == "environ":  # os.environ's own dict: putenv through os.environ writes it
            return self._watch(value)
        if kind == "keys":  # order matters: an OrderedDict reorders without a new dict version
            return not isinstance(value, collections.OrderedDict) and self._watch(value)
        if kind == "not_in_dict":
            own = getattr(value, "__dict__", None)
            return isinstance(own, dict) and self._watch(own)
        if kind == "code" and type(value) is types.FunctionType:
            self.functions[id(value)] = value
            return True
        return False


_DYNAMO_DIR = os.path.join(os.path.dirname(os.path.abspath(torch.__file__)), "_dynamo")


def _unpatched(f: Any) -> Any:
    """The function Dynamo wrapped: on its first compile Dynamo replaces nn.Module.__init__ and __setstate__ with
    wrappers that call the originals (mutation_guard.py); a class is the same class before and after that."""
    for _ in range(4):
        if not (isinstance(f, types.FunctionType) and f.__code__.co_filename.startswith(_DYNAMO_DIR)
                and f.__closure__):
            return f
        inner = [c.cell_contents for c in f.__closure__
                 if isinstance(getattr(c, "cell_contents", None), types.FunctionType)]
        if len(inner) != 1:
            return f
        f = inner[0]
    return f


class _ClassUnchanged:
    """A user's class still has the contents it was traced with: its digest, recomputed only when one of its
    MRO's dicts changed (a method assigned to the class after the first call is seen)."""

    def __init__(self, cls: type, digest: str) -> None:
        from .. import _C

        self.cls, self.digest = cls, digest
        dicts = [d for c in cls.__mro__ if not c.__flags__ & _IMMUTABLE_TYPE if (d := _type_dict(c)) is not None]
        self.watch = _C.StateWatch(dicts, [])
        self.watch.snapshot()

    def __call__(self) -> bool:
        if self.watch.unchanged():
            return True
        self.watch.snapshot()
        if _class_digest(self.cls) == self.digest:
            return True
        self.watch.invalidate()
        return False


def _type_dict(cls: type) -> dict[Any, Any] | None:
    """A class's own dict (behind the mappingproxy `cls.__dict__`)."""
    import gc

    proxy = cls.__dict__
    found = [r for r in gc.get_referents(proxy) if isinstance(r, dict)]
    return found[0] if len(found) == 1 else None


class _Fails(Exception):
    pass


def _hold(held: list[Any], obj: Any) -> str:
    held.append(obj)
    return f"H[{len(held) - 1}]"


def _condition(rec: dict[str, Any], value: Any, v: str, held: list[Any], locals_: dict[str, Any],
               globals_: dict[str, Any], var: Callable[[Path], str]) -> tuple[str, str | None]:
    kind, expect = rec["kind"], rec.get("expect")
    if kind == "type":
        now = type_name(type(value))
        if now != expect:
            if now[:2] == expect[:2]:
                return "", f"built for another version of class {'.'.join(expect[:2])} (its methods or class " \
                           "attributes differ: Note [A user's class is fingerprinted by its contents])"
            return "", f"built for a {'.'.join(expect[:2])}, now a {'.'.join(now[:2])}"
        cond = f"type({v}) is {_hold(held, type(value))}"
        if len(expect) > 2:  # Note [A user's class is fingerprinted by its contents]: also within a process
            cond += f" and {_hold(held, _ClassUnchanged(type(value), expect[2]))}()"
        return cond, None
    if kind == "id":
        try:  # a sentinel: the very object its module global holds here (Note [A sentinel is the module global ...])
            now = expect if expect[0] == "global" and _find_by_identity(expect) is value else identity(value)
        except NotCheckable:
            now = ["object", type(value).__qualname__]
        if now != expect:
            return "", f"built for {_show(expect)}, now {_show(now)}"
        return f"{v} is {_hold(held, value)}", None
    if kind == "code":
        code = getattr(value, "__code__", None)
        if not isinstance(code, types.CodeType) or identity(code) != expect:
            return "", "the function is another one (its code differs)"
        return f"{v}.__code__ is {_hold(held, code)}", None
    if kind == "equals":
        c = from_constant(expect)
        if type(value) is not type(c) or not _equal(value, c):
            return "", f"built with {c!r}, now {value!r}"
        if type(c) is float:  # by bits: -0.0 != 0.0 and NaN == NaN here, as the trace's constant would differ
            return f"type({v}) is float and {v}.hex() == {c.hex()!r}", None
        return f"type({v}) is {_hold(held, type(c))} and {v} == {_hold(held, c)}", None
    if kind == "len":
        tname, n = expect
        if type_name(type(value)) != tname or len(value) != n:
            return "", f"built with {n} items, now {len(value)}"
        return f"type({v}) is {_hold(held, type(value))} and len({v}) == {int(n)!r}", None
    if kind == "not_none":
        return (f"{v} is not None", None) if value is not None else ("", "is None")
    if kind == "not_in_dict":
        attr = _attr_name(rec["arg"], rec["source"])
        if attr in getattr(value, "__dict__", {}):
            return "", f"has its own attribute {attr!r} now"
        return f"{attr!r} not in {v}.__dict__", None
    if kind == "hasattr":
        attr = _attr_name(rec["arg"], rec["source"])
        if hasattr(value, attr) is not bool(expect):
            return "", f"hasattr {attr!r} is {not expect} now"
        return f"hasattr({v}, {attr!r}) is {bool(expect)!r}", None
    if kind == "contains":
        key = from_constant(rec["arg"])
        if (key in value) is not bool(expect):
            return "", f"{key!r} {'is no longer' if expect else 'is now'} a key"
        return f"({_hold(held, key)} in {v}) is {bool(expect)!r}", None
    if kind == "keys":  # in the mapping's own order (an OrderedDict's move_to_end leaves dict order alone)
        keys_now = list(value.keys())
        if keys_now != [from_constant(k) for k in expect]:
            return "", f"its keys changed ({keys_now!r})"
        return f"list({v}.keys()) == {_hold(held, keys_now)}", None
    if kind == "same":
        other = parse_source(rec["arg"])
        if resolve(other, locals_, globals_) is not value:
            return "", f"is no longer the same object as {rec['arg']}"
        return f"{v} is {var(other)}", None
    if kind == "environ":  # Note [Environment variables are checked by name]
        want = {str(k): (None if v is None else str(v)) for k, v in dict(expect).items()}
        now = {k: os.environ.get(k) for k in want}
        if now != want:
            changed = sorted(k for k in want if now[k] != want[k])
            return "", f"environment variable {', '.join(changed)} is {now[changed[0]]!r}, built with {want[changed[0]]!r}"
        return f"{_hold(held, _environ_is(want))}()", None
    if kind == "opaque":
        from .. import compat

        fn = compat.opaque_guard_fn(type(value))
        want = from_constant(expect)
        if fn is None or fn(value) != want:
            return "", f"the {type(value).__qualname__}'s guarded values changed"
        return f"{_hold(held, fn)}({v}) == {_hold(held, want)}", None
    if kind == "tensor":
        if not isinstance(value, torch.Tensor) or _tensor_meta(value) != expect:
            return "", "the tensor's type, dtype, device, shape, strides or requires_grad changed"
        return f"{_hold(held, _tensor_is(expect))}({v})", None
    raise NotCheckable(f"a guard record of kind {kind!r}")


def _environ_is(want: dict[str, Any]) -> Callable[[], bool]:
    def check() -> bool:
        return all(os.environ.get(k) == v for k, v in want.items())

    return check


def _tensor_is(expect: list[Any]) -> Callable[[Any], bool]:
    def check(t: Any) -> bool:
        return isinstance(t, torch.Tensor) and _tensor_meta(t) == expect

    return check


def _equal(a: Any, b: Any) -> bool:
    if type(a) is float:
        return a.hex() == b.hex() if type(b) is float else False  # -0.0 is not 0.0, NaN is NaN
    try:
        return bool(a == b)
    except Exception:  # noqa: BLE001
        return False


def _show(fingerprint: Any) -> str:
    return ".".join(str(p) for p in fingerprint[1:3]) if isinstance(fingerprint, list) else repr(fingerprint)


def _state_holds(kind: str, expect: Any) -> bool:
    if kind == "global_state":
        return _global_state() == expect
    if kind == "torch_function":
        return torch._C._len_torch_function_stack() == 0
    if kind == "default_device":
        device = torch.utils._device.CURRENT_DEVICE
        return (None if device is None else str(device)) == expect
    return _saved_tensors_hooks() is None


def _state_check(kind: str, expect: Any, held: list[Any], fast: bool = False) -> str:
    """The check of one global-state record. `fast`: the fast path's form (Note [One function checks the guards
    and binds the inputs]): C++ calls and attribute reads only; when it fails, the full path decides."""
    if kind == "global_state":
        import json

        guard = torch._C._dynamo.guards.GlobalStateGuard()
        state = dict(expect, num_threads=torch.get_num_threads())
        guard.__setstate__(json.dumps(state, separators=(",", ":")))
        checker = _ThreadsAware(guard, state)
        return f"{_hold(held, checker.guard)}.check()" if fast else f"{_hold(held, checker)}()"
    if kind == "torch_function":
        return f"{_hold(held, torch._C._len_torch_function_stack)}() == 0"
    if kind == "default_device":
        if fast and expect is None:
            return f"{_hold(held, torch.utils._device)}.CURRENT_DEVICE is None"
        return f"{_hold(held, _default_device_is(expect))}()"
    if fast:
        return f"{_hold(held, torch._C._autograd._top_saved_tensors_default_hooks)}(True) is None"
    return f"{_hold(held, _saved_tensors_hooks)}() is None"


class _ThreadsAware:
    """GlobalStateGuard.check with the thread count of this process (Note [cache_compile keys on what the
    trace read]): re-armed when torch.set_num_threads changes it."""

    def __init__(self, guard: Any, state: dict[str, Any]) -> None:
        self.guard, self.state, self.threads = guard, state, state["num_threads"]

    def __call__(self) -> bool:
        if self.guard.check():
            return True
        threads = torch.get_num_threads()
        if threads == self.threads:
            return False
        import json

        self.threads = self.state["num_threads"] = threads
        self.guard.__setstate__(json.dumps(self.state, separators=(",", ":")))
        return self.guard.check()


def _default_device_is(expect: Any) -> Callable[[], bool]:
    def check() -> bool:
        device = torch.utils._device.CURRENT_DEVICE
        return (None if device is None else str(device)) == expect

    return check
