"""Every tensor a compiled call can change, saved before its first call and put back before each rerun.

Note [Triage restores all state a step can mutate]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
A decode step changes more than its tensor arguments: a KV-cache object passed in
(`cache.k.index_copy_(...)`, `cache.length += 1`), the module's parameters and buffers,
plain tensor attributes of the module (`self.cache = torch.zeros(...)`, not registered as a
buffer), tensors in the globals and closure cells the function reads. The script keeps
calling, so by the time triage reruns the first call (re-tracing, the accuracy bisection)
all of these hold later values. Rerunning on them makes a correct stateful step look
nondeterministic in eager, and every stage compares garbage.

So at the first call, before it runs, `snapshot()` walks everything the call can reach
(arguments, the module and its submodules, objects' attributes, lists, tuples, dicts, the
function's globals and closure cells) and saves a clone of each tensor with the place it is
bound. `restore()` rebinds each place to the tensor object it held (the step may have
rebound `self.length = self.length + 1`) and copies the saved values back into that object,
in place, so every alias the script holds sees them too. `current()` names each tensor
where it is bound now, so a rerun's state after the call is compared stage against stage.
Tensor arguments themselves are cloned separately (runner.Compiled.first_args); the walk
starts below them.
"""

from __future__ import annotations

import dataclasses
import types
from typing import Any, Iterator

import torch
import torch.utils._pytree as pytree

_MAX_DEPTH = 6
_MAX_TENSORS = 4096
_MODULE_INTERNALS = frozenset(vars(torch.nn.Module()))  # _parameters, _buffers, _modules, hooks, training
_SKIP_MODULES = ("torch", "builtins", "numpy", "typing", "collections", "functools", "graphex")


@dataclasses.dataclass
class _Slot:
    name: str            # "state cache.k", "state self.length", "state global table"
    owner: Any           # the object, dict or list that binds the tensor
    key: Any             # attribute name, dict key or list index
    kind: str            # "attr" | "item"
    original: torch.Tensor
    saved: torch.Tensor

    def bound(self) -> Any:
        try:
            return getattr(self.owner, self.key) if self.kind == "attr" else self.owner[self.key]
        except (AttributeError, KeyError, IndexError, TypeError):
            return None

    def restore(self) -> None:
        if self.bound() is not self.original:
            try:
                if self.kind == "attr":
                    setattr(self.owner, self.key, self.original)
                elif not isinstance(self.owner, tuple):
                    self.owner[self.key] = self.original
            except (AttributeError, TypeError, KeyError, IndexError):
                pass
        with torch.no_grad():
            if self.original.shape == self.saved.shape and self.original.dtype == self.saved.dtype:
                self.original.copy_(self.saved)
            else:
                self.original.data = self.saved.clone()


@dataclasses.dataclass
class Snapshot:
    slots: list[_Slot]

    def restore(self) -> None:
        for slot in self.slots:
            slot.restore()

    def current(self) -> dict[str, torch.Tensor]:
        """Each saved place whose tensor a rerun changed (or rebound), as it is now, by name.

        Unchanged state (the parameters, usually) is left out: a stage that changes what eager
        did not shows up as an extra value, and nothing large is cloned per stage.
        """
        out = {}
        for slot in self.slots:
            value = slot.bound()
            if not isinstance(value, torch.Tensor):
                continue
            if value is slot.original and value.shape == slot.saved.shape and value.dtype == slot.saved.dtype \
                    and torch.equal(value, slot.saved):
                continue
            out[slot.name] = value.detach().clone()
        return out


def snapshot(target: Any, module: torch.nn.Module | None, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Snapshot:
    """Save every tensor the call `target(*args, **kwargs)` can reach (see the Note)."""
    walker = _Walker()
    if module is not None:
        walker.walk(module, "self", 0)
    named = [(f"input {i}", a) for i, a in enumerate(args)] + [(f"input {k}", a) for k, a in kwargs.items()]
    for name, arg in named:  # the tensors among pytree leaves are cloned by the runner: walk what holds more
        for j, leaf in enumerate(pytree.tree_leaves(arg)):
            walker.walk(leaf, name if leaf is arg else f"{name}[{j}]", 0)
    fn = getattr(module, "forward", None) if module is not None else target
    walker.function(fn)
    return Snapshot(walker.slots)


class _Walker:
    def __init__(self) -> None:
        self.slots: list[_Slot] = []
        self.seen: set[int] = set()
        self.tensors: set[int] = set()

    def walk(self, obj: Any, path: str, depth: int) -> None:
        if depth > _MAX_DEPTH or id(obj) in self.seen or len(self.slots) >= _MAX_TENSORS:
            return
        if isinstance(obj, (str, bytes, int, float, bool, type(None), torch.Tensor)):
            return
        self.seen.add(id(obj))
        for owner, kind, key, value, name in _children(obj, path):
            if isinstance(value, torch.Tensor):
                self.save(name, owner, key, kind, value)
            else:
                self.walk(value, name, depth + 1)

    def save(self, name: str, owner: Any, key: Any, kind: str, t: torch.Tensor) -> None:
        if id(t) in self.tensors or len(self.slots) >= _MAX_TENSORS:
            return
        self.tensors.add(id(t))
        self.slots.append(_Slot(f"state {name}", owner, key, kind, t, t.detach().clone()))

    def function(self, fn: Any) -> None:
        """Tensors (and objects holding them) in the globals the function names and its closure cells."""
        fn = getattr(fn, "__func__", fn)
        code = getattr(fn, "__code__", None)
        if code is None:
            return
        g = getattr(fn, "__globals__", {})
        for name in code.co_names:
            value = g.get(name)
            if isinstance(value, torch.Tensor):
                self.save(f"global {name}", g, name, "item", value)
            elif _user_object(value) or isinstance(value, (list, dict, torch.nn.Module)):
                self.walk(value, f"global {name}", 1)
        for name, cell in zip(code.co_freevars, getattr(fn, "__closure__", None) or ()):
            try:
                value = cell.cell_contents
            except ValueError:
                continue
            if isinstance(value, torch.Tensor):
                self.save(f"closure {name}", cell, "cell_contents", "attr", value)
            elif _user_object(value) or isinstance(value, (list, dict, torch.nn.Module)):
                self.walk(value, f"closure {name}", 1)


def _children(obj: Any, path: str) -> Iterator[tuple[Any, str, Any, Any, str]]:
    """(owner, kind, key, value, name) of what `obj` binds: module state, attributes, items."""
    if isinstance(obj, torch.nn.Module):
        for store in ("_parameters", "_buffers", "_modules"):
            table = getattr(obj, store, {})
            for key, value in list(table.items()):
                if value is not None:
                    yield table, "item", key, value, f"{path}.{key}"
        for key, value in list(vars(obj).items()):
            if key not in _MODULE_INTERNALS:
                yield obj, "attr", key, value, f"{path}.{key}"
        return
    if isinstance(obj, dict):
        for key, value in list(obj.items()):
            yield obj, "item", key, value, f"{path}[{key!r}]"
    elif isinstance(obj, (list, tuple)):
        for i, value in enumerate(obj):
            yield obj, "item", i, value, f"{path}[{i}]"
    elif _user_object(obj):
        for key, value in list(vars(obj).items()):
            yield obj, "attr", key, value, f"{path}.{key}"


def _user_object(obj: Any) -> bool:
    """An instance of a class the user wrote (its attributes may hold tensors), not a library's."""
    if isinstance(obj, (type, types.ModuleType, types.FunctionType, types.MethodType)) or not hasattr(obj, "__dict__"):
        return False
    module = type(obj).__module__ or ""
    return not module.split(".")[0] in _SKIP_MODULES
