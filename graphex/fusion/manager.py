"""The fusion pass: torch's pattern matcher over the functional ATen graph, before reinplacing.

One PatternMatcherPass holds every pattern, built-in and user's alike (npugraph_ex keeps one pass
too). Patterns are tried where they anchor (the node that computes a pattern's output), nodes from
the last to the first, and at one anchor in the order they were registered: the built-ins that
swallow a smaller built-in (add + RMSNorm, the whole gated MLP) are registered before it.
"""

from __future__ import annotations

import collections
import dataclasses
import threading
from typing import Any, Callable

import torch.fx
from torch._inductor.pattern_matcher import Match, PatternMatcherPass

from .. import _log


@dataclasses.dataclass
class _Counts:
    """Per pattern name, how often it fired in the graph being rewritten."""
    fired: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)


_pass = PatternMatcherPass(pass_name="graphex_pattern_fusion")
_lock = threading.RLock()
_builtins_registered = False
_current: _Counts | None = None
_registered: list[str] = []  # one line per pattern, for compile-cache keys


def pattern_pass() -> PatternMatcherPass:
    return _pass


def counting(name: str, extra_check: Callable[[Match], bool]) -> Callable[[Match], bool]:
    """`extra_check` that also counts a fired match under `name` (a match is applied when this says yes)."""
    def check(match: Match) -> bool:
        ok = bool(extra_check(match))
        if ok and _current is not None:
            _current.fired[name] += 1
        return ok

    return check


def note_registered(name: str, identity: str) -> None:
    _registered.append(f"{name}: {identity}")


def registered_patterns() -> list[str]:
    """What the pass holds (built-ins once traced, then users' patterns), for cache keys."""
    with _lock:
        _ensure_builtins()
        return list(_registered)


def run_fusion(gm: torch.fx.GraphModule, graph_name: str = "") -> dict[str, int]:
    """Replace every match of the registered patterns in `gm`; returns {pattern name: times fired}."""
    global _current
    with _lock:
        _ensure_builtins()
        _current = _Counts()
        try:
            _pass.apply(gm.graph)
        finally:
            fired, _current = dict(_current.fired), None
    gm.graph.eliminate_dead_code()
    gm.recompile()
    if fired:
        _log.info("%s: pattern fusion: %s", graph_name,
                  ", ".join(f"{name} x{count}" for name, count in sorted(fired.items())))
    else:
        _log.info("%s: pattern fusion: no pattern matched", graph_name)
    return fired


def _ensure_builtins() -> None:
    """The built-in patterns are traced once, at the first graph compiled with pattern_fusion_pass."""
    global _builtins_registered
    if not _builtins_registered:
        from .patterns import register_builtins

        _builtins_registered = True
        register_builtins()


def _state_for_tests() -> dict[str, Any]:
    return {"builtins_registered": _builtins_registered, "patterns": sum(len(v) for v in _pass.patterns.values())}
