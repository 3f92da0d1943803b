"""One OpInfo case: eager, then graphex (capture and a replay), compared bitwise; on a failure, the same
under aot_eager, to tell graphex's faults from Dynamo's, AOTAutograd's and the decompositions'.

Note [How a sweep failure is classified]
  bitwise         graphex's outputs and input writes are eager's, byte for byte, on capture and replay
  as_aot_eager    graphex differs from eager and so does aot_eager (decompositions round differently, or
                  eager itself is not deterministic): not graphex's doing
  graphex_diff    graphex differs from eager and aot_eager does not: a graphex bug
  graphex_error   graphex raises and aot_eager does not: a graphex bug (or a missing, explained limit)
  not_graphex     eager, Dynamo or aot_eager fails as well (a graph break under fullgraph=True, ...)
  timeout         the case ran past its time bound
"""

from __future__ import annotations

import signal
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

import graphex
from .compare import alias_difference, clone_tree, difference

# Note [Uninitialized outputs]
# These ops return memory no kernel writes (torch.empty and friends): eager, aot_eager and graphex each see
# whatever the allocator hands out, so only dtype, shape and strides are compared for them.
UNINITIALIZED = frozenset({"empty", "empty_like", "empty_permuted", "empty_strided", "new_empty", "new_empty_strided"})

CATEGORIES = ("bitwise", "as_aot_eager", "graphex_diff", "graphex_error", "not_graphex", "timeout")
FAILURES = ("graphex_diff", "graphex_error")


class CaseTimeout(Exception):
    pass


@dataclass
class Result:
    id: str
    category: str
    detail: str = ""
    engine: bool = True  # the C++ engine ran (False: Dynamo made no graph, or the op fell back)
    seconds: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)


def _run(fn: Callable[..., Any], tensors: list[torch.Tensor]) -> tuple[Any, list[torch.Tensor]]:
    """fn on fresh copies of the inputs, seeded: (outputs, the inputs after the call, to compare writes)."""
    args = clone_tree(tensors)
    torch.manual_seed(0)
    out = fn(*args)
    return out, args


def _error(e: BaseException) -> str:
    text = f"{type(e).__name__}: {e}".strip().splitlines()
    return text[0][:300] if text else type(e).__name__


def _compiled(case: Any, backend: str) -> Callable[..., Any]:
    return torch.compile(case.function(backend), backend=backend, fullgraph=True, dynamic=case.dynamic)


def _under(case: Any, backend: str, tensors: list[torch.Tensor], expected: tuple[Any, list[torch.Tensor]]
           ) -> tuple[str | None, str | None, int]:
    """(error, difference, engine runs) of `backend` on the case: a capture call and a replay call."""
    before = graphex._C.total_run_count()
    try:
        compiled = _compiled(case, backend)
        first = _run(compiled, tensors)
        second = _run(compiled, tensors)
    except CaseTimeout:
        raise
    except Exception as e:  # noqa: BLE001 - every failure is data here
        return _error(e), None, 0
    runs = graphex._C.total_run_count() - before
    values = case.id.split("/")[0] not in UNINITIALIZED
    found = (difference(first, expected, "capture call", values=values)
             or difference(second, expected, "replay call", values=values)
             or alias_difference(first, expected, "capture call") or alias_difference(second, expected, "replay call"))
    return None, found, runs


def classify(case: Any, time_limit: float) -> Result:
    start = time.perf_counter()
    previous = signal.signal(signal.SIGALRM, _on_alarm)
    signal.setitimer(signal.ITIMER_REAL, time_limit)
    try:
        result = _classify(case)
    except CaseTimeout:
        result = Result(case.id, "timeout", f"ran past {time_limit:g} s")
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    result.seconds = time.perf_counter() - start
    return result


def _on_alarm(*_: Any) -> None:
    raise CaseTimeout()


def _classify(case: Any) -> Result:
    tensors = case.tensors()
    with torch.no_grad():
        try:
            expected = _run(case.function("eager"), tensors)
        except CaseTimeout:
            raise
        except Exception as e:  # noqa: BLE001
            return Result(case.id, "not_graphex", "eager raises: " + _error(e), engine=False)
        error, diff, runs = _under(case, "graphex", tensors, expected)
        if error is None and diff is None:
            return Result(case.id, "bitwise", engine=runs > 0)
        aot_error, aot_diff, _ = _under(case, "aot_eager", tensors, expected)
        if aot_error is not None:
            return Result(case.id, "not_graphex", f"aot_eager raises too: {aot_error}",
                          extra={"graphex": error or diff})
        if error is not None:
            return Result(case.id, "graphex_error", error, engine=False)
        if aot_diff is not None:
            return Result(case.id, "as_aot_eager", f"graphex: {diff}; aot_eager: {aot_diff}", engine=runs > 0)
        again = _run(case.function("eager_again"), tensors)
        if difference(again, expected):
            return Result(case.id, "as_aot_eager", f"eager is not deterministic here; graphex: {diff}")
        return Result(case.id, "graphex_diff", diff or "", engine=runs > 0)
