"""Which guards a watched dict proves still hold (Note [A watched dict proves its guards still hold]): the paths
pinned by dicts that cannot change unseen, and a user's class checked by the digest of its MRO's dicts."""

from __future__ import annotations

import collections
import enum
import types
from typing import Any

import torch

from .guard_sources import Path, parse_source, resolve
from .fingerprints import _IMMUTABLE_TYPE, _class_digest, _is_mutable_class


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
        self.owners: dict[int, tuple[Any, dict[Any, Any]]] = {}  # Note [A watched dict must stay its object's dict]
        self._pinned: dict[Path, bool] = {}

    def _watch(self, d: Any) -> bool:
        if type(d) is not dict and not isinstance(d, dict):
            return False
        if type(d).__getitem__ is not dict.__getitem__ and type(d).__module__ != "collections":
            return False  # a dict subclass with its own lookup
        self.dicts[id(d)] = d
        return True

    def _watch_own(self, owner: Any, own: Any) -> bool:
        """An instance's own __dict__, watched with its owner (Note [A watched dict must stay its object's dict])."""
        if type(own) is not dict or not self._watch(own):
            return False
        self.owners[id(owner)] = (owner, own)
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
            return self._watch_own(base, own)
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
            return isinstance(own, dict) and self._watch_own(value, own)
        if kind == "code" and type(value) is types.FunctionType:
            self.functions[id(value)] = value
            return True
        if kind == "hasattr" and rec.get("expect") is True:  # torch 2.11: hasattr(layers, "__iter__") on a ModuleList
            return self._found_in_class(value, rec["arg"])
        return False

    def _found_in_class(self, value: Any, name: str) -> bool:
        """`hasattr(value, name)` holds while value's type and its classes' dicts do: the name is a plain function or
        value (no descriptor that could raise) in a class dict of the MRO, and attribute lookup is object's own."""
        cls = type(value)
        if type(cls) is not type or cls.__getattribute__ is not object.__getattribute__:
            return False
        for c in cls.__mro__:
            if name in vars(c):
                attr = vars(c)[name]
                plain = isinstance(attr, types.FunctionType) or not hasattr(type(attr), "__get__")
                if not plain:
                    return False
                self.objects[id(value)] = value
                self._watch_class(cls)
                return True
        return False


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
