"""Portable fingerprints of what a guard read: constants by value, types, modules, classes and functions by
qualified name (functions also by their code), the global torch state; each comparable in another process
(Note [cache_compile keys on what the trace read], graphex/inference/guards.py)."""

from __future__ import annotations

import contextlib
import contextvars
import enum
import os
import hashlib
import sys
import threading
import struct
import types
import weakref
from typing import Any, Iterator

import torch

from .guard_sources import NotCheckable, _CONSTANT_TYPES


def float_key(x: float) -> str:
    """A float as a string that compares exactly: its hex (-0.0 is not 0.0), and for a NaN its bits, which float.hex()
    drops ('nan' for every NaN, whatever its sign: `copysign(1.0, s)` tells them apart; found by a helper)."""
    if x != x:
        return "nan:" + struct.pack(">d", x).hex()
    return x.hex()


def float_from_key(key: str) -> float:
    if key.startswith("nan:"):
        return struct.unpack(">d", bytes.fromhex(key[4:]))[0]
    return float.fromhex(key)


def constant(value: Any) -> Any:
    """A JSON rendering of a constant that compares exactly (floats by float_key), or NotCheckable."""
    t = type(value)
    if t in (int, bool, str, type(None)):
        return [t.__name__, value]
    if t is float:
        return ["float", float_key(value)]
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
        return float_from_key(v)
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


# Note [A code object's digest is computed once]
# A code object is immutable, so its digest never changes: it is kept, per code object (by identity, checked
# through a weak reference, since equal code objects may differ in co_qualname, which the digest reads), for the
# life of the process. The first call of a warm process digests every method of every class its guards name
# (Note [A user's class is fingerprinted by its contents]); nn.Module's ~100 methods are in every module
# class's MRO, and were digested again for each.
_code_digests: dict[int, tuple[weakref.ref[types.CodeType], str]] = {}
_code_digests_lock = threading.Lock()


def _code_digest(code: types.CodeType) -> str:
    known = _code_digests.get(id(code))
    if known is not None and known[0]() is code:
        return known[1]
    digest = _compute_code_digest(code)
    key = id(code)

    def forget(_: object, key: int = key) -> None:
        with _code_digests_lock:
            entry = _code_digests.get(key)
            if entry is not None and entry[0]() is None:
                del _code_digests[key]

    with _code_digests_lock:
        _code_digests[key] = (weakref.ref(code, forget), digest)
    return digest


def _compute_code_digest(code: types.CodeType) -> str:
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


# Note [One check reads each class body once]
# One check of an entry's guards (guards.bind) names ~100 classes whose MROs share most of their classes
# (nn.Module in every one). Inside `one_check()` each class body's part of a digest is computed once and reused;
# nothing runs between the reads that could assign to a class, so the parts stay what they were.
_class_parts: contextvars.ContextVar[dict[type, bytes] | None] = contextvars.ContextVar("graphex_class_parts",
                                                                                        default=None)


@contextlib.contextmanager
def one_check() -> Iterator[None]:
    """Within: each class body is digested once (Note [One check reads each class body once])."""
    token = _class_parts.set({})
    try:
        yield
    finally:
        _class_parts.reset(token)


def _class_digest(t: type) -> str:
    h = hashlib.sha256()
    parts = _class_parts.get()
    for cls in t.__mro__:
        if not _is_mutable_class(cls):
            continue
        part = parts.get(cls) if parts is not None else None
        if part is None:
            part = _class_part(cls)
            if parts is not None:
                parts[cls] = part
        h.update(part)
    return h.hexdigest()[:24]


# A class dict's names that are no part of what the class does: `__slotnames__` is copyreg's cache of the slot names
# (derived from the `__slots__` of the MRO, which are digested), written into the class the first time an instance is
# copied or pickled: a `copy.deepcopy(cache)` made the next call miss as "another version of class StaticCache"
# (found by a helper).
_NOT_CONTENTS = ("__dict__", "__weakref__", "__doc__", "__module__", "__qualname__", "__slotnames__")


def _class_part(cls: type) -> bytes:
    """What one class body adds to a digest: its name, and each attribute it defines."""
    h = hashlib.sha256()
    h.update(f"{cls.__module__}.{cls.__qualname__}".encode())
    for name, value in sorted(vars(cls).items()):
        if name in _NOT_CONTENTS or name.startswith("___"):
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
    return h.digest()


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


_IMMUTABLE_TYPE = 1 << 8  # Py_TPFLAGS_IMMUTABLETYPE: a builtin or extension type no one can assign to


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
