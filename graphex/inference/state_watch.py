"""The Python side of StateWatch (csrc/python/state_watch.cpp): the numbers of its slot kinds, and everything watching
a class reads (Note [A class is watched by everything its digest reads]), for the digest's own check
(_ClassUnchanged), the fast path's watch (pins.py) and its rebind test (SameMembers)."""

from __future__ import annotations

import types
from typing import Any

from .fingerprints import _IMMUTABLE_TYPE, _class_digest, _unpatched


# Note [A slot or a list is watched by what it points to] (csrc/python/state_watch.cpp): the attributes StateWatch
# reads as one pointer the object holds, by the kind of object, with StateWatch::SlotKind's numbers.
SLOT_KINDS: dict[type, dict[str, int]] = {
    types.CellType: {"cell_contents": 0},
    types.FunctionType: {"__defaults__": 1, "__kwdefaults__": 2, "__name__": 3, "__qualname__": 4},
    type: {"__mro__": 5, "__name__": 6, "__qualname__": 7},  # a class's; the names of a heap class only
    property: {"fget": 8, "fset": 9, "fdel": 10},  # a property's (a subclass's too): `property.__init__` replaces them
    classmethod: {"__func__": 11},  # a classmethod's (a subclass's too): `__init__` replaces it
    staticmethod: {"__func__": 12},
}

# Note [A class is watched by everything its digest reads]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# A class's digest (Note [A user's class is fingerprinted by its contents], fingerprints.py) reads each class dict of
# its MRO and, through them, each method's code, each classmethod's and staticmethod's function and its code, and each
# property's getter and setter and their code. A dict's version sees an attribute assigned, not a method changed in
# place: `C.m.__code__ = other.__code__` and `vars(C)["cm"].__init__(f)` leave every dict as it was, and the digest was
# recomputed only when a dict changed, so the old method's result was replayed (found adversarially; Dynamo misses
# both too). So whatever watches a class (the digest's check, _ClassUnchanged, and the fast path's watch, _Pins)
# watches the same things, listed once here: the MRO's dicts, the MRO tuple, each function's code pointer, and which
# function each classmethod, staticmethod and property (or an instance of a subclass of one) holds. Those functions
# are the ones the class dicts held when the watch was built: a full check that passes with others there (`C.m = g`,
# g with m's code: the digest is equal) publishes no watch and asks for a new bind (Note [A watch is of the objects it
# was built from]), so g is watched from then on (SameMembers); _ClassUnchanged builds its own watch again. A class
# dict that changed in another way (Dynamo's compile of another function writes its markers into classes) costs a
# full check, not a bind.
def class_watch(cls: type) -> tuple[list[dict[Any, Any]], list[types.FunctionType], list[tuple[Any, int]]]:
    """(dicts, functions, slots) for StateWatch: what `_class_digest(cls)` reads."""
    dicts: list[dict[Any, Any]] = []
    functions: list[types.FunctionType] = []
    slots: list[tuple[Any, int]] = [] if cls.__flags__ & _IMMUTABLE_TYPE else [(cls, SLOT_KINDS[type]["__mro__"])]
    for c in cls.__mro__:
        if c.__flags__ & _IMMUTABLE_TYPE or (d := _type_dict(c)) is None:
            continue
        dicts.append(d)
        _body_watch(d, functions, slots)
    return dicts, functions, slots


def _body_watch(d: dict[Any, Any], functions: list[types.FunctionType], slots: list[tuple[Any, int]]) -> None:
    """Adds what one class dict holds that StateWatch watches beyond the dict: functions and descriptors' slots."""
    for value in d.values():
        kind = classmethod if isinstance(value, classmethod) else staticmethod if isinstance(value, staticmethod) \
            else property if isinstance(value, property) else None  # their subclasses too: the same head
        if kind in (classmethod, staticmethod):
            slots.append((value, SLOT_KINDS[kind]["__func__"]))
            value = value.__func__
        elif kind is property:
            slots += [(value, SLOT_KINDS[property]["fget"]), (value, SLOT_KINDS[property]["fset"])]
            functions += [f for f in (value.fget, value.fset) if type(f) is types.FunctionType]
            continue
        value = _unpatched(value)  # Dynamo's wrapper of nn.Module.__init__: the digest reads the original too
        if type(value) is types.FunctionType:
            functions.append(value)


class SameMembers:
    """Whether the classes hold the functions and descriptors they held when this was made (by identity: the watch
    that was built from them holds them alive)."""

    def __init__(self, classes: list[type]) -> None:
        self.dicts = list({id(d): d for cls in classes for d in class_watch(cls)[0]}.values())  # each class dict once
        self.members = self._members()

    def _members(self) -> list[int]:
        functions: list[types.FunctionType] = []
        slots: list[tuple[Any, int]] = []
        for d in self.dicts:
            _body_watch(d, functions, slots)
        return [id(f) for f in functions] + [id(o) for o, _ in slots]

    def __call__(self) -> bool:
        return self._members() == self.members


class _ClassUnchanged:
    """A user's class still has the contents it was traced with: its digest, recomputed only when something it reads
    changed (Note [A class is watched by everything its digest reads]). `watch` stays one object for its life where it
    can: a FastCall holds it (guards.py, _native_arg_check) and asks it on each call."""

    def __init__(self, cls: type, digest: str) -> None:
        self.cls, self.digest = cls, digest
        self.watch, self.members = self._new_watch(*class_watch(cls))

    @staticmethod
    def _new_watch(dicts: list[dict[Any, Any]], functions: list[types.FunctionType],
                   slots: list[tuple[Any, int]]) -> tuple[Any, list[int]]:
        from .. import _C

        watch = _C.StateWatch(dicts, [], functions, slots=slots)
        watch.snapshot()  # before the digest is read: a change made meanwhile is seen at the next call
        return watch, [id(f) for f in functions] + [id(o) for o, _ in slots]

    def __call__(self) -> bool:
        if self.watch.unchanged():
            return True
        dicts, functions, slots = class_watch(self.cls)
        if [id(f) for f in functions] + [id(o) for o, _ in slots] == self.members:
            fresh = None
            self.watch.snapshot()  # the same functions: the watch the FastCall holds answers again
        else:  # `C.m = g`, g with m's code: watch g from now on (the FastCall's old watch stays changed: it misses)
            fresh = self._new_watch(dicts, functions, slots)
        if _class_digest(self.cls) == self.digest:
            if fresh is not None:
                self.watch, self.members = fresh
            return True
        self.watch.invalidate()
        return False


def _type_dict(cls: type) -> dict[Any, Any] | None:
    """A class's own dict (behind the mappingproxy `cls.__dict__`)."""
    import gc

    proxy = cls.__dict__
    found = [r for r in gc.get_referents(proxy) if isinstance(r, dict)]
    return found[0] if len(found) == 1 else None
