"""Where a graphex step goes: the engine's own per-instruction timing, grouped by operator.

Runs the captured program directly (Executor.run_timed: two clock reads per
instruction) on the inputs of one real call, and reports each operator's share of
the step, plus the time spent outside the timed instructions (binding, checks,
Python). For the decoder this shows how much of a step is matrix multiplication,
which no host-overhead work can shorten: eager runs the very same kernels.
"""

from __future__ import annotations

import collections
from typing import Any, Callable


def capture_args(graph: Any, call: Callable[[], Any]) -> list[Any]:
    """The argument list graphex's engine received during one `call()`."""
    seen: list[list[Any]] = []
    unwatch = graph.watch(lambda args, _outs: seen.append(list(args)))
    try:
        call()
    finally:
        unwatch()
    if not seen:
        raise RuntimeError("the engine was not called")
    return seen[0]


def breakdown(graph: Any, args: list[Any], repeat: int = 50, top: int = 8) -> dict[str, Any]:
    names = graph.executor.node_names()
    per_op: collections.Counter[str] = collections.Counter()
    calls: collections.Counter[str] = collections.Counter()
    for _ in range(5):
        graph.executor.run_timed(list(args))
    for _ in range(repeat):
        _, ns = graph.executor.run_timed(list(args))
        for (_, target), t in zip(names, ns):
            per_op[target] += t
            calls[target] += 1
    total = sum(per_op.values())
    rows = [{"op": op, "us_per_step": t / repeat / 1e3, "share": t / total, "calls_per_step": calls[op] // repeat}
            for op, t in per_op.most_common(top)]
    return {"instructions_us_per_step": total / repeat / 1e3, "top": rows}
