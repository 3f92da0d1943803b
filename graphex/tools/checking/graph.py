"""Check 6: the op inside a graphex-compiled function gives eager's outputs and writes; opcheck passes.

The compiled function is just `op(*args)`, compiled with the graphex backend
(fullgraph, static shapes) and run under no_grad on clones of the recorded
inputs. Its outputs and every tensor input afterwards are compared with
torch.equal against what eager produced on the recorded call. Dynamo is reset
before each case: the wrapper is one code object, and one cache entry per op
would soon hit Dynamo's recompile limit.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch

from graphex.custom_ops import reset_dynamo
from graphex.custom_ops.registration import Registration

from . import values
from .record import Call
from .report import Problem


def check_graph(call: Call, reg: Registration) -> list[Problem]:
    problem = _graphex_vs_eager(call, reg)
    return [problem] if problem is not None else _opcheck(call, reg)


def _graphex_vs_eager(call: Call, reg: Registration) -> Problem | None:
    op = call.op

    def run_op(*args: Any, **kwargs: Any) -> Any:
        return op(*args, **kwargs)

    reset_dynamo()
    compiled = torch.compile(run_op, backend="graphex", fullgraph=True, dynamic=False)
    args, kwargs = values.clone(call.args), values.clone(call.kwargs)
    try:
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if call.rng_state is not None:
                torch.random.set_rng_state(call.rng_state)  # a kernel that draws random numbers draws the same
            out = compiled(*args, **kwargs)
    except Exception as e:  # noqa: BLE001  (any failure to compile or replay is the finding)
        return _problem(call, reg, "compiles with graphex and runs", f"{type(e).__name__}: {_head(e)}")
    finally:
        reset_dynamo()
    diff = _first_difference(values.outputs_list(call.outputs), values.outputs_list(out), "output")
    if diff is None:
        expected_inputs = dict(call.bound(), **call.after)
        got_inputs = values.bind(op._schema, args, kwargs)
        for name, expected in expected_inputs.items():
            diff = _first_difference(expected, got_inputs.get(name), f"input {name} after the call")
            if diff is not None:
                break
    if diff is None:
        return None
    return _problem(call, reg, f"{diff[0]} as in eager: {diff[1]}", f"graphex gave {diff[2]}")


def _opcheck(call: Call, reg: Registration) -> list[Problem]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            results = torch.library.opcheck(call.op, values.clone(call.args), values.clone(call.kwargs),
                                            raise_exception=False)
        except Exception as e:  # noqa: BLE001
            results = {"opcheck": e}
    for test, result in results.items():
        if result != "SUCCESS":
            return [_problem(call, reg, f"torch.library.opcheck passes ({test})",
                             f"{test} failed: {type(result).__name__}: {_head(result)}", opcheck=True)]
    return []


def _problem(call: Call, reg: Registration, expected: str, seen: str, opcheck: bool = False) -> Problem:
    op = f"torch.ops.{call.op.namespace}.{call.op._opname}.{call.op._overloadname}"
    if opcheck:
        fix = ("# checks 1-5 pass on this call, but torch.library.opcheck does not; reproduce with\n"
               f"torch.library.opcheck({op}, args)  # args: {call.inputs_text()}")
    else:
        fix = ("# checks 1-5 pass on this call, so the graph differs for another reason; reproduce with\n"
               f"f = torch.compile(lambda *a: {op}(*a),\n"
               '                  backend="graphex", fullgraph=True, dynamic=False)\n'
               f"# on inputs {call.inputs_text()}, and compare with eager (GRAPHEX_LOG=2 shows the graph).\n"
               "# A kernel whose result depends on more than its inputs (a global, a counter) differs this way.")
    return Problem(call.op.name(), "graph_matches_eager", call.case_id, expected, seen, fix)


def _first_difference(expected: Any, got: Any, what: str) -> tuple[str, str, str] | None:
    if isinstance(expected, torch.Tensor):
        if not isinstance(got, torch.Tensor):
            return what, values.short(expected), values.short(got)
        if expected.shape != got.shape or expected.dtype != got.dtype or not values.same_values(expected, got):
            return what, values.short(expected) + _sample(expected), values.short(got) + _sample(got)
        return None
    if isinstance(expected, (list, tuple)):
        if not isinstance(got, (list, tuple)) or len(got) != len(expected):
            return what, values.short(expected), values.short(got)
        for i, (e, g) in enumerate(zip(expected, got)):
            diff = _first_difference(e, g, f"{what}[{i}]")
            if diff is not None:
                return diff
    return None


def _sample(t: torch.Tensor) -> str:
    flat = t.detach().reshape(-1)[:4].tolist()
    return f" starting {[round(v, 4) if isinstance(v, float) else v for v in flat]}"


def _head(e: BaseException) -> str:
    lines = [line for line in str(e).strip().splitlines() if line.strip()]
    return " / ".join(lines[:3])[:400]
