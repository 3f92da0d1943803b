"""cache_compile: torch.compile with the graphex backend, remembered on disk across processes.

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            ...
            self.cached_forward = graphex.inference.cache_compile(self._forward, dynamic=False)

        def forward(self, x):
            return self.cached_forward(x)

The first call with a new input signature traces with Dynamo, captures the program
and writes it to the cache directory; later calls, in this process or a fresh one,
load it, bind the module's current parameters and buffers by name and run on the
C++ engine with no Dynamo and no AOTAutograd. See Note [What the compile cache
keys on] (keys.py) for what makes an entry stale. This file is the call (CachedFunction);
the cache directory's entries are cache_store.py's, the calls it does not cache uncached.py's.

Note [A cache hit imports no compiler]
A process whose calls all hit the cache never traces, so it never imports Dynamo, AOTAutograd or inductor (about
two seconds of imports on this project's VM, more than `import torch` itself): the cold path (capture.py) is
imported by the first miss, graphex.errors (its classes derive from Dynamo's, Note [Our errors pass through
Dynamo unwrapped]) where an error is raised, and fused mode's pattern matcher at its first use
(fusion/manager.py); the call is traced spelled out (Note [A call is spelled out]), so its guards read nothing
of Dynamo's. Where the traced code itself went through one of Dynamo's polyfills (torch.distributions does), the
guard check imports that module (guard_sources.resolve_global). tests/python/test_cache_import.py checks it.
"""

from __future__ import annotations

import functools
import inspect
import os
import time
from typing import Any, Callable

import torch
from torch.utils import _pytree as pytree

from .. import _C
from ..base import log as _log
from .. import compat
from ..base.warn import warn_once
from ..distributed import world_key
from ..fusion.manager import registered_patterns
from ..options import Options
from . import cache_store, keys
from .fingerprints import float_key
from .flat_call import make_flat
from .loaded import MISS, Loaded, collector_paused
from .uncached import RAN, remember_compiled, side_effects_on_real_arguments

DEFAULT_DIR = ".graphex_cache"


def cache_compile(func: Callable[..., Any], *, dynamic: bool = False, cache_dir: str | os.PathLike | None = None,
                  options: dict[str, Any] | None = None) -> "CachedFunction":
    """Compile `func` (a bound method of an nn.Module, or a plain function) with a persistent cache.

    cache_dir defaults to $GRAPHEX_CACHE_DIR or ./.graphex_cache. `options` are the
    graphex backend's options (see `graphex options`).
    """
    if not callable(func):
        raise TypeError(f"cache_compile: expected a bound method of an nn.Module or a function, got {func!r}")
    owner = getattr(func, "__self__", None)
    if owner is not None and not isinstance(owner, torch.nn.Module):
        raise TypeError(f"cache_compile: {func!r} is a method of {type(owner).__qualname__}, not of an "
                        "nn.Module; pass a bound method of your module (self._forward) or a plain function")
    if isinstance(func, torch.nn.Module):
        raise TypeError("cache_compile: pass the module's method (e.g. model._forward or model.forward), "
                        "not the module itself")
    _set_what_torch_compile_sets()
    return CachedFunction(func, dynamic=dynamic, cache_dir=cache_dir, options=options)


@functools.cache
def _set_what_torch_compile_sets() -> None:
    """Note [cache_compile sets what torch.compile sets]
    torch.compile, the first time it is called in a process, changes one piece of global state a trace can read:
    torch.distributions' default `validate_args` becomes False (Dynamo's TorchPatcher.patch; its other changes
    wrap tracing entry points a compiled function never calls). A cold process traces under it, so an entry of a
    model that builds a distribution records False; a warm process, which never calls torch.compile, would have
    True, miss every time, and rewrite the entry (found by a helper). cache_compile, the stand-in for
    torch.compile, makes the same change when it is first called, in every process alike; a later change by the
    user is still checked by the entry's guards, as under torch.compile."""
    torch.distributions.Distribution.set_default_validate_args(False)


_NOT_A_LEAF = object()  # CachedFunction.__call__: an argument that pytree flattens further


def _call_value(a: Any, any_leaf: bool = False) -> Any:
    """What one argument adds to the call key: nothing for a tensor (its entry's guards and the engine check it),
    the value of a number (a float by its bits: -0.0 is not 0.0), the type of any other leaf (its guards check
    its contents; it need not be hashable)."""
    t = type(a)
    if t is torch.Tensor:
        return None
    if t is float:
        return (float, float_key(a))
    if t in (int, bool, type(None), str):
        return (t, a)
    if isinstance(a, torch.Tensor):
        return t  # a subclass or Parameter: its own entries (the type is guarded too)
    return t if any_leaf else _NOT_A_LEAF
_LEAF_TYPES = (torch.Tensor, int, float, bool)  # pytree leaves (Note [A plain call skips pytree])



def _each_argument_a_leaf(flat: list[Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """Whether the call flattened to its arguments themselves, positional then keyword values in the call's order (no
    container among them): what a FastCall made with keyword names rebuilds from a call (Note [A plain call's fast
    path is one C++ call])."""
    given = (*args, *kwargs.values())
    return len(flat) == len(given) and all(f is a for f, a in zip(flat, given))


class CachedFunction(_C.CachedCall):
    """The callable cache_compile returns. `stats` counts hits, misses, compiles and writes.

    Calling it enters C++ at once (Note [cache_compile's call enters C++ at once], csrc/python/cached_call.cpp): a call
    tries the FastCall of the last hit whose arguments were all leaves (`_fast`); anything else comes to `_call`."""

    def __init__(self, func: Callable[..., Any], *, dynamic: bool, cache_dir: Any, options: Any) -> None:
        self._func = func
        self._module = getattr(func, "__self__", None)
        self._dynamic = bool(dynamic)
        self._options = Options.from_user(options)
        self.cache_dir = os.fspath(cache_dir or os.environ.get("GRAPHEX_CACHE_DIR") or DEFAULT_DIR)
        self._by_call: dict[Any, list[Loaded]] = {}
        self._plain_specs: dict[int, pytree.TreeSpec] = {}  # Note [A plain call skips pytree]
        self._uncacheable: dict[Any, Callable[..., Any]] = {}
        # Note [A call that changes its list or dict arguments runs on them]
        self._changes_arguments: set[Any] = set()  # call keys whose calls change a list or dict argument
        self._on_real_arguments: Callable[..., Any] | None = None  # torch.compile of the function itself
        self._holds_containers: dict[Any, bool] = {}  # in_spec -> a list or dict among the arguments
        self.stats = {"hits": 0, "misses": 0, "compiles": 0, "writes": 0}
        identity = keys.function_identity(func)
        self._name = identity["qualname"].replace("<", "").replace(">", "").replace("/", "_")

    @property
    def __signature__(self) -> inspect.Signature:
        """The wrapped function's (inspect.signature, transformers' look at a forward's parameters): the C call slot
        has none of its own."""
        return inspect.signature(self._func)

    def __getstate__(self) -> dict[str, Any]:
        """What copy.deepcopy and pickle keep: the function, options and directory; not this process's loaded
        entries and compiled fallbacks (C++ programs, Dynamo callables), nor its counts: a copy loads or compiles
        its own on its first call.
        The C fast path is never copied: it watches this instance's module."""
        state = dict(self.__dict__)
        state.update(_by_call={}, _plain_specs={}, _uncacheable={}, _changes_arguments=set(),
                     _on_real_arguments=None, _holds_containers={},
                     stats={"hits": 0, "misses": 0, "compiles": 0, "writes": 0})
        return state

    # -- the call ---------------------------------------------------------------------------------
    def _call(self, /, *args: Any, **kwargs: Any) -> Any:
        """Every call the FastCall did not answer (CachedCall's call slot, C++)."""
        # Note [A plain call skips pytree]: positional tensors and numbers only (the common serving call)
        # flatten to themselves, so neither tree_flatten nor hashing a TreeSpec is paid per call; the key
        # (the argument count) cannot collide with a TreeSpec key, and one call shape always takes one path.
        values = None if kwargs else tuple(map(_call_value, args))
        plain = values is not None and _NOT_A_LEAF not in values
        if plain:
            flat = list(args)
            in_spec = self._plain_specs.get(len(args))
            if in_spec is None:
                in_spec = self._plain_specs[len(args)] = pytree.tree_flatten((args, {}))[1]
            call_key: Any = (len(args), values)
        else:
            flat, in_spec = pytree.tree_flatten((args, kwargs))
            call_key = (in_spec, tuple(_call_value(a, any_leaf=True) for a in flat))
        needs_autograd = torch.is_grad_enabled() and self._needs_autograd(flat)
        if not plain and self._holds_containers_of(in_spec):
            # Note [A call that changes its list or dict arguments runs on them]
            if needs_autograd or call_key in self._changes_arguments or _shares_a_container((args, kwargs)):
                return self._run_on_real_arguments(args, kwargs)
        if needs_autograd:
            return self._plain_compiled(flat, in_spec)
        for loaded in self._by_call.get(call_key, ()):  # newest first
            result = loaded.try_run(flat)  # Note [Entries are found by signature, not by exceptions]
            if result is not MISS:
                if plain:
                    self._fast = loaded.fast_call(args)
                elif _each_argument_a_leaf(flat, args, kwargs):  # the FastCall flattens such a call itself
                    self._fast = loaded.fast_call(tuple(flat), tuple(kwargs))
                return result
        return self._load_or_compile(flat, in_spec, call_key, (args, kwargs))

    # Note [A call that changes its list or dict arguments runs on them]
    # A cache entry's program is traced from a flat call that rebuilds the call's lists and dicts
    # (flat_call.py), so a function that appends to a list argument, or sets a key of a dict one,
    # would change the copy, not the caller's object, on every path (the compiling call included);
    # and a hit replays the graph alone, which holds no such change anyway. So before a call holding
    # a list or dict is traced for an entry, Dynamo traces the function on the call's own arguments
    # once, with a backend that only asks what the trace changes in Python state and stops before
    # anything runs (_side_effects_on_real_arguments). If it changes anything (or cannot say), that
    # call key is never cached: it runs through torch.compile on the real arguments, where Dynamo
    # replays the changes on them, as do such calls that need autograd or cannot be cached. Calls of
    # tensors, numbers and tuples hold no container a function could change and are never probed.
    # One list or dict passed twice (f(x, l, l)) would reach the traced function as two (`a is b` false,
    # a helper's find), so such a call runs on the real arguments too (_shares_a_container).
    def _holds_containers_of(self, in_spec: pytree.TreeSpec) -> bool:
        found = self._holds_containers.get(in_spec)
        if found is None:
            args_spec, kwargs_spec = compat.treespec_children(in_spec)
            found = self._holds_containers[in_spec] = _has_container(args_spec) or any(
                _has_container(c) for c in compat.treespec_children(kwargs_spec))  # **kwargs itself is a new dict
        return found

    def _run_on_real_arguments(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if self._on_real_arguments is None:
            self._on_real_arguments = remember_compiled(self._func, None, self._options, self._dynamic)
        try:
            return self._on_real_arguments(*args, **kwargs)
        except torch._dynamo.exc.FailOnRecompileLimitHit:  # Note [A fresh code object per cold compile]
            self._on_real_arguments = remember_compiled(self._func, None, self._options, self._dynamic)
            return self._on_real_arguments(*args, **kwargs)

    def _needs_autograd(self, flat: list[Any]) -> bool:
        if any(isinstance(a, torch.Tensor) and a.requires_grad for a in flat):
            return True
        return self._module is not None and any(p.requires_grad for p in self._module.parameters())

    def _plain_compiled(self, flat: list[Any], in_spec: pytree.TreeSpec) -> Any:
        if ("autograd", in_spec) not in self._uncacheable:
            warn_once("cache_compile:autograd",
                      "graphex.inference.cache_compile: autograd is needed (grad mode on and a parameter or input "
                      "requires grad), so this call is compiled without the cache. Call it under torch.no_grad() "
                      "or torch.inference_mode() to use the cache.")
        return self._run_uncached(("autograd", in_spec), flat, in_spec)

    def _run_uncached(self, key: Any, flat: list[Any], in_spec: pytree.TreeSpec) -> Any:
        """Plain torch.compile (no entry), for calls that cannot be cached; keeps serving new shapes."""
        if key not in self._uncacheable:
            self._uncacheable[key] = remember_compiled(self._func, in_spec, self._options, self._dynamic)
        try:
            return self._uncacheable[key](*flat)
        except torch._dynamo.exc.FailOnRecompileLimitHit:
            # Note [A fresh code object per cold compile]: start a new code object rather than fail.
            warn_once(f"cache_compile:recompile_limit:{self._name}",
                      f"graphex.inference.cache_compile: {self._name} reached Dynamo's recompile limit "
                      f"(torch._dynamo.config.recompile_limit = {torch._dynamo.config.recompile_limit}) on its "
                      "uncached path; it keeps compiling new shapes with a fresh code object. For fewer compiles "
                      "pass dynamic=True or pad inputs to a few shapes.")
            self._uncacheable[key] = remember_compiled(self._func, in_spec, self._options, self._dynamic)
            return self._uncacheable[key](*flat)

    # -- a miss: the cache directory, then a compile ------------------------------------------------
    def _key_parts(self, flat: list[Any], in_spec: pytree.TreeSpec) -> dict[str, Any]:
        # Computed on every miss, never remembered: the module's attributes may have changed since the last one,
        # and an entry traced with the new values must not be written under the old values' key.
        return {**keys.versions(),
                "function": keys.function_identity(self._func),
                "module": keys.module_structure(self._module) if isinstance(self._module, torch.nn.Module) else None,
                "options": self._options.cache_key(),
                # the patterns registered are part of the program fused mode makes
                "fusion_patterns": registered_patterns() if self._options.pattern_fusion_pass else None,
                "dynamic": self._dynamic,
                "in_spec": pytree.treespec_dumps(in_spec),
                "signature": keys.input_signature(flat, self._dynamic), "grad": torch.is_grad_enabled(),
                "world": world_key()}  # Note [A program belongs to its world] (graphex/distributed.py)

    def _load_or_compile(self, flat: list[Any], in_spec: pytree.TreeSpec, call_key: Any,
                         real: tuple[tuple[Any, ...], dict[str, Any]]) -> Any:
        if call_key in self._uncacheable:
            if self._holds_containers_of(in_spec):  # Note [A call that changes its list or dict arguments ...]
                return self._run_on_real_arguments(*real)
            return self._run_uncached(call_key, flat, in_spec)
        start = time.perf_counter()
        parts = self._key_parts(flat, in_spec)
        key = keys.digest(parts)
        prefix = os.path.join(self.cache_dir, f"{self._name}-{key[:24]}")
        why, stale = "no entry yet", []
        for path in cache_store.candidates(prefix):
            with collector_paused():  # Note [Loading an entry pauses the collector]
                loaded, why = cache_store.load(path, key, self._func)
                result = loaded.try_run(flat) if loaded is not None else MISS
            if loaded is None:
                if why.startswith("stale"):
                    stale.append(path)
                continue
            if result is MISS:
                why = f"the entry does not fit this call ({loaded.why})"
                continue
            self.stats["hits"] += 1
            self._by_call.setdefault(call_key, []).insert(0, loaded)
            _log.info("cache hit: %s (%.1f ms to first output)", path, (time.perf_counter() - start) * 1e3)
            return result
        self.stats["misses"] += 1
        if why == "no entry yet":
            why = cache_store.other_worlds(self.cache_dir, self._name, parts) or why
        _log.info("cache miss for %s %s: %s", self._name, keys.describe_signature(flat), why)
        if self._holds_containers_of(in_spec):  # Note [A call that changes its list or dict arguments runs on them]
            changes, ran = side_effects_on_real_arguments(self._func, *real)
            if changes is None or changes:
                self._changes_arguments.add(call_key)
                warn_once(f"cache-changes-arguments:{self._name}",
                          f"graphex cache: {self._name} runs compiled but cannot be cached: "
                          + (f"it changes Python state when it runs ({'; '.join(changes[:3])}), " if changes else
                             "it may change Python state when it runs and Dynamo could not say what, ")
                          + "which a cached program would not do.")
                return ran if ran is not RAN else self._run_on_real_arguments(*real)
        return self._compile(flat, in_spec, call_key, parts, key, prefix, stale)

    def _compile(self, flat: list[Any], in_spec: pytree.TreeSpec, call_key: Any, parts: dict[str, Any],
                 key: str, prefix: str, stale: list[str]) -> Any:
        from .capture import compile_cold  # Note [A cache hit imports no compiler]

        start = time.perf_counter()
        try:
            result, entry, why = compile_cold(self._func, flat, in_spec, self._options, self._dynamic, parts)
        except Exception as e:  # noqa: BLE001  (only Dynamo's "the function raised" is answered here)
            if not compat.raised_by_traced_code(e):
                raise
            raised = True
        else:
            raised = False
        if raised:
            # Note [A function that raises gives its own error]: the trace met an exception the function does not
            # catch (`cfg.flag` read after `del cfg.flag`), which Dynamo reports as "Unsupported: Observed exception".
            # Nothing of the trace ran for real, so calling the function as written raises what eager raises (an
            # AttributeError naming the attribute), after eager's own side effects; nothing is cached.
            return make_flat(self._func, in_spec)(*flat)
        self.stats["compiles"] += 1
        if entry is None:
            warn_once(f"cache-uncacheable:{self._name}:{why}",
                      f"graphex cache: {self._name} runs compiled but cannot be cached: {why}.")
            self._uncacheable[call_key] = remember_compiled(self._func, in_spec, self._options, self._dynamic)
            return result
        entry.header["compile_seconds"] = round(time.perf_counter() - start, 3)
        path = cache_store.entry_path(prefix, entry)
        if cache_store.write(self.cache_dir, path, entry, stale):
            self.stats["writes"] += 1
        loaded = Loaded(entry, self._func, path)
        loaded.validate_next = False  # the cold run already validated custom ops' fakes
        self._by_call.setdefault(call_key, []).insert(0, loaded)
        _log.info("cache: compiled %s %s in %.2f s -> %s", self._name, entry.header["signature"],
                  time.perf_counter() - start, path)
        return result



def _shares_a_container(tree: Any) -> bool:
    """Whether one list or dict object appears twice among the call's arguments (the flat call would rebuild it as
    two; Note [A call that changes its list or dict arguments runs on them])."""
    seen: set[int] = set()
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, (list, dict)):
            if id(node) in seen:
                return True
            seen.add(id(node))
            stack.extend(node.values() if isinstance(node, dict) else node)
        elif isinstance(node, tuple):
            stack.extend(node)
    return False


def _has_container(spec: pytree.TreeSpec) -> bool:
    """A list or dict anywhere in `spec` (a tuple, a namedtuple or None cannot be changed in place)."""
    if spec.is_leaf():
        return False
    return spec.type in (list, dict) or issubclass(spec.type, (list, dict)) or any(
        _has_container(c) for c in compat.treespec_children(spec))


__all__ = ["cache_compile", "CachedFunction", "DEFAULT_DIR"]
