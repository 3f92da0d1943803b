"""graphex.register_replacement: users' patterns for fused mode, with npugraph_ex's signature.

    import graphex
    graphex.register_replacement(search_fn, replace_fn, example_inputs)

`search_fn` is traced on `example_inputs` into an ATen pattern; wherever a graph compiled with
pattern_fusion_pass=True contains it, the match is replaced by `replace_fn` traced on the
match's own inputs (typically a call of a custom op). Patterns go into the same pass as the
built-in ones (graphex/fusion/manager.py), after them; with pattern_fusion_pass=False (the
default) no pattern runs. The parameters are torch's pattern matcher's (and npugraph_ex's):

    trace_fn           how both functions are traced (fwd_only: an inference graph)
    extra_check        fn(match) -> bool, run on each match with the real shapes; False skips it
    search_fn_pattern  a PatternExpr to use instead of tracing search_fn
    scalar_workaround  {argname: example value} for float/int arguments of search_fn, so that
                       the literal in the graph is matched as that argument
    skip_duplicates    register nothing (and return False) when the same pattern is registered already

Traced the way graphex's graphs are made: with no decomposition table (the graph keeps
silu, _softmax, rsqrt, ...), not inductor's.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Iterable

from torch._inductor.pattern_matcher import Match, PatternExpr, fwd_only

from .. import compat
from . import manager


def _return_true(match: Match) -> bool:
    return True


def no_decompositions() -> dict[Any, Callable[..., Any]]:
    """graphex's AOTAutograd runs with no decomposition table; patterns are traced the same way."""
    return {}


def register_replacement(search_fn: Callable[..., Any], replace_fn: Callable[..., Any], example_inputs: Iterable[Any],
                         trace_fn: Callable[..., Any] = fwd_only, extra_check: Callable[[Match], bool] = _return_true,
                         search_fn_pattern: PatternExpr | None = None,
                         scalar_workaround: dict[str, float | int] | None = None,
                         skip_duplicates: bool = False) -> bool:
    """Register a pattern for fused mode; True when registered (False: a duplicate skipped)."""
    return register_named(getattr(search_fn, "__qualname__", repr(search_fn)), search_fn, replace_fn,
                          example_inputs, trace_fn=trace_fn, extra_check=extra_check,
                          search_fn_pattern=search_fn_pattern, scalar_workaround=scalar_workaround,
                          skip_duplicates=skip_duplicates)


def register_named(name: str, search_fn: Callable[..., Any], replace_fn: Callable[..., Any],
                   example_inputs: Iterable[Any], *, trace_fn: Callable[..., Any] = fwd_only,
                   extra_check: Callable[[Match], bool] = _return_true, search_fn_pattern: PatternExpr | None = None,
                   scalar_workaround: dict[str, float | int] | None = None, skip_duplicates: bool = False,
                   builtin: bool = False, count_as: Callable[[Match], str] | None = None) -> bool:
    """register_replacement with the name GRAPHEX_LOG reports when the pattern fires (`count_as(match)`, where given:
    the kernel one match runs, for a pattern whose replacement picks its kernel by the match's shapes). A built-in
    returns True: registered now, or once a graph holds its ops (Note [A built-in pattern is registered once a graph
    can hold it], manager.py)."""
    example_inputs = list(example_inputs)
    registry = manager.REGISTRY
    with registry.lock:
        if not builtin:
            registry.ensure_builtins()  # built-ins first: at a shared anchor they are tried first
        check = manager.checked(name, search_fn, replace_fn, extra_check, count_as)

        def register(first_trace: Callable[..., Any] | None) -> bool:
            return compat.register_replacement(
                search_fn, replace_fn, example_inputs, trace_fn, manager.pattern_pass(), check,
                get_decomp_fn=no_decompositions, scalar_workaround=scalar_workaround,
                search_fn_pattern=search_fn_pattern, skip_duplicates=skip_duplicates, pattern_name=name,
                first_trace=first_trace)

        if builtin:  # its first trace is the shipped graph: Note [Built-in patterns ship as traced graphs]
            assert registry.graphs is not None, "built-ins are registered by ensure_builtins, which reads the graphs"
            registry.register_builtin(register, functools.partial(
                registry.graphs.first_trace, search_fn, example_inputs, scalar_workaround))
            return True
        try:
            registered = registry.register_user(lambda: register(None))
        except RuntimeError as e:
            if not str(e).startswith("Duplicate pattern"):
                raise
            # torch's message is the pattern's printout alone; what it means and the fix, in the same type (a caller
            # of npugraph_ex's API may catch RuntimeError)
            raise RuntimeError(
                f"graphex.register_replacement: {name} is a pattern already registered, on the same graph: a built-in "
                "fused-mode pattern or one of yours matches exactly what it matches, and is tried first. Pass "
                "skip_duplicates=True to skip it (register_replacement then returns False), or change search_fn "
                "(docs/fused-mode.md, 'Your own patterns'). torch's check said:\n" + str(e)) from None
        if registered:  # the built-ins are keyed by their source (manager.registered_patterns)
            from ..options import _callable_identity

            manager.note_registered(name, _callable_identity(search_fn) + _callable_identity(replace_fn))
    return bool(registered)
