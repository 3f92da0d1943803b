"""The calls cache_compile does not cache, run through torch.compile (cache_compile.py's CachedFunction): calls that
need autograd, that cannot be cached, or that change a list or dict argument (Note [A call that changes its list or dict
arguments runs on them], cache_compile.py), and the probe that asks Dynamo whether a call changes Python state. Nothing
here imports Dynamo until it is called (Note [A cache hit imports no compiler], cache_compile.py)."""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch.utils import _pytree as pytree

from .. import compat
from ..options import Options
from .flat_call import make_flat


def remember_compiled(func: Callable[..., Any], in_spec: pytree.TreeSpec | None, options: Options,
                       dynamic: bool) -> Callable[..., Any]:
    """torch.compile of the call, for the calls cache_compile cannot cache.

    Note [The uncached path sees a new hook]
    Dynamo builds no guards on a module's hooks dicts by default (torch._dynamo.config.
    skip_nnmodule_hook_guards), so a forward hook registered after the first call is not seen by
    plain torch.compile. A cached entry checks those dicts (Note [cache_compile keys on what the
    trace read]); so that the uncached path is not stale where an entry would not be, its compiles
    build the hook guards. (A method assigned to the class is still torch.compile's to see.)"""
    from ..backend import graphex_backend  # the function, not its name: Note [Two threads' first lookup of a name]

    # in_spec None: the function itself, on the call's own arguments (Note [A call that changes its list or dict
    # arguments runs on them])
    compiled = torch.compile(real_call(func) if in_spec is None else make_flat(func, in_spec), backend=graphex_backend,
                             fullgraph=True, dynamic=dynamic, options=options)

    def call(*flat: Any, **kwargs: Any) -> Any:
        with torch._dynamo.config.patch(skip_nnmodule_hook_guards=False):  # read when a compile builds guards
            return compiled(*flat, **kwargs)

    return call


def real_call(func: Callable[..., Any]) -> Callable[..., Any]:
    """`func` called on the call's own arguments, through a code object of its own (Note [A fresh code object per
    cold compile]): Dynamo inlines `func`, so its recompile limit counts this wrapper's entries, not func's."""
    def real_call(*args: Any, **kwargs: Any) -> Any:
        return func(*args, **kwargs)

    real_call.__code__ = real_call.__code__.replace()
    return real_call


class _Probed(Exception):
    def __init__(self, changes: list[str] | None) -> None:
        super().__init__("graphex: the probe stops here")
        self.changes = changes


RAN = object()


def side_effects_on_real_arguments(func: Callable[..., Any], args: tuple[Any, ...],
                                    kwargs: dict[str, Any]) -> tuple[list[str] | None, Any]:
    """(What `func(*args, **kwargs)` changes in Python state, by source name, from a Dynamo trace of the call on
    its own arguments whose backend stops it before anything runs, or None when Dynamo cannot say; RAN or the
    call's result). A trace with no graph to compile never reaches the backend: Dynamo then runs the call itself,
    and its result is returned with (None, result), so that it is not run twice (Note [A call that changes its
    list or dict arguments runs on them])."""
    def probe(gm: torch.fx.GraphModule, example_inputs: list[Any], **_: Any) -> Any:
        effects = compat.dynamo_side_effects()
        raise _Probed(None if effects is None else [e.source for e in effects])

    try:
        result = torch.compile(real_call(func), backend=probe, fullgraph=True, dynamic=False)(*args, **kwargs)
    except Exception as e:  # noqa: BLE001  Dynamo wraps what the backend raised
        inner: BaseException | None = e
        for _ in range(8):
            if isinstance(inner, _Probed):
                return inner.changes, RAN
            inner = getattr(inner, "inner_exception", None) or inner.__cause__
            if inner is None:
                break
        raise  # the call itself failed, as it would have compiled
    return None, result
