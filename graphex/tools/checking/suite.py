"""Which checks run on which recorded call, and what a failure skips.

Checks 3 and 4 need only the recording; checks 2 and 5 need a fake (check 1);
check 6 compiles the op, so it runs only on a case where everything else
passed: its failure would repeat an earlier one, and a compile costs seconds.
"""

from __future__ import annotations

import functools
import sys
from typing import Callable

import torch

from graphex.custom_ops import fixes
from graphex.custom_ops.registration import describe

from . import CHECKS, fake, graph, mutation
from .propose import Proposal, propose
from .record import Call, Recording
from .report import OpResult, Problem, Report


def run(recording: Recording, report: Report, case: str | None = None,
        progress: Callable[[str], None] | None = None) -> None:
    progress = progress or (lambda line: print(line, file=sys.stderr, flush=True))
    for name, calls in recording.calls.items():
        if case is not None:
            calls = [c for c in calls if c.case_id == case]
        if calls:
            report.ops.append(_check_op(name, calls, recording.total.get(name, len(calls)), report, progress))


def _check_op(name: str, calls: list[Call], seen: int, report: Report, progress) -> OpResult:
    op = calls[0].op
    reg = describe(op)
    found: dict[str, list[Problem]] = {check: [] for check in CHECKS}
    skipped: set[str] = set()
    ran: set[str] = set()
    proposal: Callable[[], Proposal] = functools.cache(lambda: propose(op, calls[0].args, calls[0].kwargs))

    def add(problems: list[Problem]) -> list[Problem]:
        for p in problems:
            found[p.check].append(p)
        return problems

    progress(f"graphex check: {name} ({len(calls)} case(s) of {seen} call(s)): fake_exists")
    missing = add(fake.check_exists(calls[0], reg, proposal))
    op_level = add(mutation.check_declared_written(calls, reg))
    for call in calls:
        inputs = call.inputs_text()
        progress(f"graphex check: {call.case_id} ({inputs if len(inputs) < 160 else inputs[:157] + '...'}): checks 2-5")
        case_problems = list(op_level)
        if missing:
            skipped.update(("fake_matches", "fake_reads_no_data"))
        else:
            fake_problems = add(fake.check_fake(call, reg, proposal))
            if any(p.check == "fake_reads_no_data" for p in fake_problems):
                skipped.add("fake_matches")  # a fake that cannot run has no outputs to compare
            else:
                ran.add("fake_matches")
            case_problems += fake_problems
        case_problems += add(mutation.check_writes(call, reg))
        case_problems += add(mutation.check_aliases(call, reg))
        if missing or case_problems:
            skipped.add("graph_matches_eager")
            continue
        progress(f"graphex check: {call.case_id}: graph_matches_eager (graphex compile, opcheck)")
        ran.add("graph_matches_eager")
        add(graph.check_graph(call, reg))
    for check in CHECKS:
        for p in found[check]:
            report.add(p)
    status = {check: "FAIL" if found[check] else ("skipped" if check in skipped - ran else "pass") for check in CHECKS}
    return OpResult(name, reg.style, reg.defined_at, seen, [(c.case_id, c.inputs_text()) for c in calls], status)


def explain_failure(op, inputs: str, traceback_text: str) -> dict[str, str]:
    """What to tell when the script failed inside a custom op's kernel, in eager."""
    reg = describe(op)
    failed = {"op": op.name(), "inputs": inputs, "why": "its kernel raised on these inputs in eager; graph mode "
              "cannot work before eager does (the traceback above shows where)", "fix": ""}
    if "may not alias any inputs to this custom operator" in traceback_text:
        first = next((a.name for a in op._schema.arguments if isinstance(a.type, torch.TensorType)), "x")
        failed["why"] = ("check 4 no_output_alias: it returned an input or a view of one, which "
                         "torch.library.custom_op refuses even in eager")
        failed["fix"] = fixes.return_clone(reg, 0, first)
    return failed
