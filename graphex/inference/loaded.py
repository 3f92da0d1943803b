"""A cache entry bound to this process (cache_compile.py's hits): its program loaded in C++, its guards checked on
the first call and then as one generated function, its results rebuilt as the function returned them."""

from __future__ import annotations

import contextlib
import functools
import gc
import sys
from typing import Any, Callable

import torch
from torch.utils import _pytree as pytree

from .. import _C, compat
from . import keys
from .entry import Entry
from .flat_call import guards_scope
from .guards import FAST_CALL_VALUE_TYPES, GuardSet

# Note [A watch is of the objects it was built from]: binding again costs about what the first call's bind did; a
# function that puts new objects on its paths at every call (`self.state = State()` in forward) would pay it on every
# call, so after this many an entry stops binding again and checks every call in full (correct, without its fast path)
_MAX_REBINDS = 8


class Loaded:
    """A cache entry bound to this process: an executor plus how to feed it and read it."""

    def __init__(self, entry: Entry, func: Callable[..., Any], path: str) -> None:
        self.path = path
        self.header = entry.header
        self.func = func
        # Note [One binder]: the program's bindings, shape guards and result leaves, resolved from its tables in C++
        self.program = _C.BoundProgram(entry.program, path)
        self.executor = self.program.executor
        self.validate_next = bool(entry.header.get("validate_fake"))
        self.out_spec = pytree.treespec_loads(entry.header["outputs"]["spec"])
        self.unflatten = _unflattener(self.out_spec)
        self.bindings = entry.bindings
        self.single_leaf = self.out_spec.is_leaf()
        self.guard_set = GuardSet(entry.header["dynamo_guards"])
        self.bind: Callable[[list[Any], Any], list[Any] | None] | None = None
        self.why = ""  # the guard that failed, for the cache-miss message
        self._fast_call: Any = None  # built at the first plain hit (Note [A plain call's fast path is one C++ call])
        self._fast_for: tuple[str, ...] = ()  # the keywords _fast_call was made for
        self._rebinds = 0  # Note [A watch is of the objects it was built from]
        self._watch_arguments = True  # Note [An object passed in is watched while the same one is passed]

    def try_run(self, flat: list[Any]) -> Any:
        """The call's result, or MISS (nothing run) if this entry does not fit the call.

        Note [Entries are found by signature, not by exceptions]
        A call key (argument structure and non-tensor values) can have several entries (one per
        shape, dtype or stride signature, or per set of shape guards). Each is asked in turn
        whether the call fits: its Dynamo guards and input bindings (one generated function,
        Note [One function checks the guards and binds the inputs]), its shape guards, then the
        program's input signature in C++ with Executor.try_run, which answers None instead of
        raising; so finding the k-th entry costs k-1 checks and no exception.
        """
        bind = self.bind
        if bind is None:  # the first call in this process: every guard resolved and compared (guards.py)
            problem = self.guard_set.bind(*guards_scope(self.func, flat), inputs=self.bindings,
                                          watch_arguments=self._watch_arguments)
            if problem is not None:
                self.why = f"guard failed: {problem}"
                return MISS
            bind = self.bind = self.guard_set.run
        held = bind(flat, self.func)
        if held is None:
            self.why = "a guard failed: the state the trace read changed since (Note [cache_compile keys on what " \
                       "the trace read])"
            return MISS
        if self.guard_set.needs_rebind:  # Note [A watch is of the objects it was built from]
            self._rebind(flat)
        if self.validate_next:
            return self._first_run_validated(flat, held)
        leaves = self.program.try_run(flat, held)
        if leaves is None:
            self.why = self._why_not(flat, held)
            return MISS
        if self.single_leaf:  # one result returned as it is: no pytree per call
            return leaves[0]
        return self.unflatten(leaves)

    def _rebind(self, flat: list[Any]) -> None:
        """Note [A watch is of the objects it was built from]: the guards held on objects other than those bind
        found; bound again on the objects there now, the fast path (and a new FastCall) watches them. If that bind
        fails (the state changed again meanwhile), the old function stays, its watch off: every call checks in full."""
        if self._rebinds >= _MAX_REBINDS and self._watch_arguments:
            # Note [An object passed in is watched while the same one is passed]: new objects passed in at every call
            # (or new objects on its paths): bound once more without watching arguments, then as below
            self._watch_arguments, self._rebinds = False, 0
        if self._rebinds >= _MAX_REBINDS:  # a function that puts new objects there on every call: checked in full
            self.guard_set._stale[0] = False
            return
        self._rebinds += 1
        problem = self.guard_set.bind(*guards_scope(self.func, flat), inputs=self.bindings,
                                      watch_arguments=self._watch_arguments)
        if problem is None:
            self.bind = self.guard_set.run
        else:
            self.guard_set._stale[0] = False  # no rebind per call: the full check answers each call, as it must
        self._fast_call = None

    def fast_call(self, args: tuple[Any, ...], kwnames: tuple[str, ...] = ()) -> Any:
        """A _C.FastCall for calls like `args` (a hit just now, flattened: the last len(kwnames) passed by those
        names), or None (Note [A plain call's fast path is one C++ call])."""
        if self._fast_call is None or self._fast_for != kwnames:
            parts = self.guard_set.fast_parts  # one bind's residual and published pair, read as one object
            if self.validate_next or self.bind is None or parts is None:
                return None
            native, published = parts
            state = native["state"]
            self._fast_call = _C.FastCall(
                self.program, published,
                # a number or str by value (guards.FAST_CALL_VALUE_TYPES); anything else (a tensor, an object passed
                # in: a StaticCache) by its exact type, its guards (the residual) checking what the trace read of it;
                # never by its __eq__, which may lie or run anything
                [(type(a), a if type(a) in FAST_CALL_VALUE_TYPES and a is not None else None, native["args"].get(i))
                 for i, a in enumerate(args)],
                state["global_state"].check if "global_state" in state else None, "saved_tensors_hooks" in state,
                "torch_function" in state, state.get("default_device"),
                None if self.single_leaf else self.unflatten, native["residual"], self.func, list(kwnames), MISS)
            self._fast_for = kwnames
        return self._fast_call

    def _why_not(self, flat: list[Any], held: list[Any]) -> str:
        inputs = self.program.bind(flat, held)
        if inputs is None:
            return (f"{keys.describe_signature(flat)} fails the shape guards of {self.path} "
                    "(Note [A dynamic entry carries its shape guards])")
        # the arguments' signature alone may be the same: a parameter the entry binds may have another layout
        why = self.executor.mismatch(inputs) or "a frozen input changed"
        return f"{keys.describe_signature(flat)}: {why}"

    def _first_run_validated(self, flat: list[Any], held: list[Any]) -> Any:
        inputs = self.program.bind(flat, held)
        if inputs is None or not self.executor.fits(inputs):
            self.why = self._why_not(flat, held)
            return MISS
        try:
            outs = self.executor.run_validated(inputs)
        except Exception as e:
            # A FakeMismatch comes from C++, which imported graphex.errors to raise it; a run that raises nothing
            # imports neither errors.py nor the custom-op checks (Note [A cache hit imports no compiler]).
            errors = sys.modules.get("graphex.errors")
            if errors is None or not isinstance(e, errors.FakeMismatch):
                raise
            from ..custom_ops import explain_fake_mismatch

            raise explain_fake_mismatch(*_fake_mismatch_details(self, e)) from None
        self.validate_next = False
        leaves = self.program.results(outs, flat)
        return leaves[0] if self.single_leaf else self.unflatten(leaves)


@contextlib.contextmanager
def collector_paused() -> Any:
    """Python's cyclic garbage collector off for the block, back on after it (unless it was off already).

    Note [Loading an entry pauses the collector]
    Loading an entry and its first bind in a process (every guard resolved: hundreds of access paths parsed,
    classes and code digested) make tens of thousands of short-lived objects. Each allocation burst may trigger a collection, and in a
    process that has imported torch but no compiler (Note [A cache hit imports no compiler]) few objects are old
    enough to hold off the full ones, which walk all of torch's objects: on the benchmark decoder that made the
    first call about three times as long (0.05 s with the collector paused, 0.13-0.17 s without). What the bind
    leaves behind is collected as usual afterwards."""
    enabled = gc.isenabled()
    if enabled:
        gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _unflattener(spec: pytree.TreeSpec) -> Callable[[list[Any]], Any]:
    """The function that rebuilds a result from its leaves: pytree's, with a torch.Size put back where the function
    returned one (pytree rebuilds a Size as a plain tuple; eager's `x.shape` is a Size, found by a helper)."""
    plain = functools.partial(pytree.tree_unflatten, treespec=spec)
    if not _holds_size(spec):
        return plain
    return lambda leaves: _sizes_restored(plain(leaves), spec)


def _holds_size(spec: pytree.TreeSpec) -> bool:
    return spec.type is torch.Size or any(_holds_size(c) for c in compat.treespec_children(spec))


def _sizes_restored(value: Any, spec: pytree.TreeSpec) -> Any:
    if spec.type is torch.Size:
        return torch.Size(value)
    children = compat.treespec_children(spec)
    if not any(_holds_size(c) for c in children):
        return value
    if isinstance(value, dict):
        return type(value)((k, _sizes_restored(value[k], c)) for k, c in zip(spec.context, children))
    items = [_sizes_restored(v, c) for v, c in zip(value, children)]
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # a namedtuple
        return type(value)(*items)
    return type(value)(items) if isinstance(value, (list, tuple)) else value


MISS = object()  # Loaded.try_run: the entry does not fit this call


def _fake_mismatch_details(loaded: Loaded, e: Any) -> tuple[Any, ...]:
    node_names = loaded.executor.node_names()
    name, target = node_names[e.node_index]
    op_name, _, overload = target.partition(".")
    ns, _, opname = op_name.partition("::")
    op = getattr(getattr(getattr(torch.ops, ns), opname), overload or "default")
    return op, name, e.output, e.expected, e.actual, ""
