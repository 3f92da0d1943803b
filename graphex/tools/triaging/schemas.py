"""Which custom op breaks the schema the graph passes trust, found by running the step in eager.

Note [An accuracy finding names the op]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
When the first stage that differs is aot_eager (functionalization) or force_eager
(graphex's passes), the usual cause is a custom op whose kernel writes an input its schema
does not declare (mutates_args / Tensor(a!)) or returns an input: both transformations
trust the schema. Saying "check every custom op" leaves the user to guess, so the step is
run once more in eager under `graphex check`'s recorder (tools/checking/record.py), which
sees each custom op's real inputs before and after its kernel; its checks 3 and 4
(tools/checking/mutation.py) name the op, the argument and the registration to paste.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io

import torch

from .runner import Compiled


@dataclasses.dataclass
class SchemaProblem:
    op: str       # "ns::name"
    what: str     # "breaks its schema: the kernel wrote x (...); the schema promises ..."
    fix: str      # the registration to paste


def schema_problems(entry: Compiled) -> list[SchemaProblem]:
    """Custom ops that write undeclared inputs or return inputs, on the first call's inputs in eager."""
    from ...custom_ops.registration import describe
    from ..checking import mutation
    from ..checking.record import Recorder

    recorder = Recorder(max_per_op=1)
    args, kwargs = entry.fresh_inputs()
    quiet = io.StringIO()
    try:
        with contextlib.redirect_stdout(quiet), contextlib.redirect_stderr(quiet), torch.no_grad(), recorder:
            entry.target(*args, **kwargs)
    except Exception:  # the eager stage reports a failing model; here only what was recorded counts
        pass
    found = []
    for calls in recorder.calls.values():
        for call in calls:
            reg = describe(call.op)
            for p in mutation.check_writes(call, reg) + mutation.check_aliases(call, reg):
                found.append(SchemaProblem(p.op, f"breaks its schema: {p.seen}; the schema promises {p.expected}",
                                           p.fix))
    return found
