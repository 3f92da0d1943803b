"""Accuracy bisection, the npugraph_ex way: eager -> aot_eager -> graphex force_eager -> graphex replay.

Each compiled function the script called is run again from its first call's inputs (fresh
clones; the module's parameters and buffers put back), under torch.no_grad(), at every stage:

  eager        the model as written; run twice, since a model that is not deterministic in
               eager cannot be bisected bitwise
  aot_eager    Dynamo + AOTAutograd (functionalization), no graphex
  force_eager  graphex's optimized graph, after its passes, run by torch.fx (option force_eager)
  replay       the same graph replayed by the C++ engine

The first stage whose outputs, inputs after the call or module state differ from eager names
the culprit. When force_eager is first, the option of every pass of the pipeline
(graphex.passes.PIPELINE, the table run_passes runs: CSE and pattern fusion included) is
switched off in turn to name the pass. Every stage compiles with fullgraph=False so a graph
break does not stop the bisection; torch._dynamo.reset() (with graphex's custom-op checks put
back) runs between stages.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
from typing import Any

import torch

from ...custom_ops import reset_dynamo
from .compare import Diff, RunResult, compare
from .findings import Finding, error_line, root_error
from .runner import Compiled
from .schemas import schema_problems

STAGES = ("eager", "aot_eager", "force_eager", "replay")

_MEANING = {
    "aot_eager": ("the difference appears under Dynamo + AOTAutograd alone, before graphex is involved: the "
                  "model or a custom op behaves differently once traced and functionalized (a custom op that "
                  "writes an input it does not declare in mutates_args / Tensor(a!), one that reads Python "
                  "state, or a tracing problem). Reproduce with backend='aot_eager'."),
    "force_eager": ("graphex's graph passes change the result (the C++ engine is not involved: force_eager runs "
                    "the optimized graph in torch.fx). {passes}Passes trust op schemas: check that every custom "
                    "op declares the arguments it writes (mutates_args / Tensor(a!))."),
    "replay": ("the optimized graph is right in torch.fx but the C++ replay differs: the graphex engine, or a "
               "custom op whose fake/Meta function lies about output shapes, strides or dtypes (the engine "
               "plans with what the fake says). Keep validate_fake on, and set GRAPHEX_DUMP=dir to compare "
               "graph_N.py with graph_N.plan.txt."),
}


@dataclasses.dataclass
class Bisection:
    name: str
    compiled_at: str
    stages: dict[str, str]          # stage -> "bitwise equal" / what differs / "raised ..."
    culprit: str = ""               # the first stage that differs ("" if none, "eager" if eager is not deterministic)
    verdict: str = ""               # what differs where
    meaning: str = ""               # what that implies, and what to try
    problem: bool = False
    raised: bool = False            # the culprit stage raised a GraphexError (a finding of its own)
    max_abs: float | None = None
    op: str = ""                    # the custom op whose schema explains the difference ('' if none found)
    failed_in_script: str = ""      # the script's own call of it raised (its compile failed): what, one line
    first_op: str = ""              # culprit replay: the first op whose output differs from eager (per_op.py)

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def bisect(entry: Compiled) -> Bisection:
    options = entry.graphex_options()
    result = Bisection(entry.name, entry.compiled_at, {})
    if entry.error is not None:  # Note [A stage graphex did not run proves nothing]
        result.failed_in_script = f"call {entry.error_call} raised {error_line(entry.error)}"
    eager = _run(entry, None)
    if eager.values is None:
        result.stages["eager"] = f"raised {eager.error}"
        result.verdict = "the model fails in eager on these inputs; nothing to compare against"
        return result
    again = compare(eager, _run(entry, None))
    result.stages["eager"] = "deterministic" if again.same else f"not deterministic: {again.describe()}"
    if not again.same:
        result.culprit = "eager"
        result.verdict = "eager gives different results for the same inputs"
        result.meaning = ("a nondeterministic op or kernel, or state that changes per call: the stages cannot be "
                          "compared bitwise. Make the model deterministic (seeds, torch.use_deterministic_algorithms) "
                          "and triage again.")
        return result
    for stage in STAGES[1:]:
        run = _run(entry, stage, options)
        diff = compare(eager, run)
        result.stages[stage] = diff.describe()
        if run.graphs == 0:  # Note [A stage graphex did not run proves nothing]
            result.stages[stage] = "graphex captured no graph: Dynamo ran the function in eager"
            if not result.culprit:
                result.culprit, result.raised, result.problem = stage, True, True
                result.verdict = (f"graphex captured no graph at stage {stage} (Dynamo skipped the function, see "
                                  "the graph breaks above): nothing of graphex was compared")
        elif run.graphex_error and not result.culprit:  # the error is reported (and counted) on its own
            result.culprit, result.raised = stage, True
            result.verdict = f"{stage} raises {run.error.split(':', 1)[0]} (reported above); nothing to compare"
        elif not diff.same and not result.culprit:
            result.culprit, result.max_abs = stage, diff.max_abs
            result.problem = not diff.close
            passes = _guilty_passes(entry, options, eager) if stage == "force_eager" else ""
            result.verdict = f"{stage} is the first stage that differs from eager: {diff.describe()}"
            result.meaning = _MEANING[stage].format(passes=passes)
            if diff.close:
                result.meaning = "only by rounding: not a bug unless bitwise equality is required."
            elif stage == "replay":  # Note [An accuracy finding names the op]: per-op data dumps name it
                _name_first_op(result, entry, options)
            elif stage in ("aot_eager", "force_eager"):  # Note [An accuracy finding names the op]
                for p in schema_problems(entry):
                    result.op = result.op or p.op
                    result.meaning = f"custom op {p.op} {p.what}. Fix its registration:\n{p.fix}\n\n" + result.meaning
    return result


def finding(b: Bisection) -> Finding | None:
    if not b.culprit or b.raised:
        return None
    title = (f"{b.name}: eager is not deterministic" if b.culprit == "eager"
             else f"{b.name}: results first differ at stage {b.culprit}")
    return Finding("accuracy", title, where=b.compiled_at, fix=b.meaning,
                   detail=b.verdict, problem=b.problem, op=b.op)


def _run(entry: Compiled, stage: str | None, options: dict[str, Any] | None = None) -> RunResult:
    """One stage: compile (unless eager), call on fresh inputs, collect outputs and what was mutated."""
    from ...errors import GraphexError
    from ...runtime import live_graphs

    reset_dynamo()
    args, kwargs = entry.fresh_inputs()
    before = {id(g) for g in live_graphs()}
    graphs = -1
    quiet = io.StringIO()
    try:
        with contextlib.redirect_stdout(quiet), contextlib.redirect_stderr(quiet), torch.no_grad():
            fn = entry.target if stage is None else _compiled(entry, stage, options or {})
            out = fn(*args, **kwargs)
        if stage in ("force_eager", "replay"):
            graphs = sum(1 for g in live_graphs() if id(g) not in before)
    except Exception as e:
        return RunResult(None, error_line(e, 160), isinstance(root_error(e), GraphexError))
    finally:
        reset_dynamo()
    result = RunResult.of(out, args, kwargs, entry.state_after())
    result.graphs = graphs
    return result


def _name_first_op(result: Bisection, entry: Compiled, options: dict[str, Any]) -> None:
    from .per_op import first_differing_op

    found = first_differing_op(entry, options, _run)
    if found is None:
        return
    result.first_op = found.describe()
    result.op = result.op or found.target
    result.verdict += f"; {result.first_op}"
    result.meaning = (
        f"{result.first_op}: every op before it matches eager, so that op's kernel computes something else "
        f"when the engine calls it. The engine calls the kernel of the tensors' backend directly (under no_grad "
        f"it skips the Autograd key, as inference tensors do); eager goes through every key: a custom op whose "
        f"Autograd (or CompositeImplicit) kernel and backend kernel disagree shows up here. Fix that op's "
        f"kernels so they agree. To look yourself: options={{'dump_tensor_data': True, 'data_dump_stage': "
        f"'optimized'}} and then 'original' dump every op's output (docs/debugging.md).")


def _compiled(entry: Compiled, stage: str, options: dict[str, Any]) -> Any:
    if stage == "aot_eager":
        return torch.compile(entry.target, backend="aot_eager", fullgraph=False, dynamic=entry.dynamic)
    opts = dict(options, force_eager=(stage == "force_eager"))
    return torch.compile(entry.target, backend="graphex", fullgraph=False, dynamic=entry.dynamic, options=opts)


def bisected_passes() -> tuple[str, ...]:
    """The options _guilty_passes switches off one at a time: every pass of the pipeline (graphex.passes.PIPELINE)."""
    from ...passes import pass_options

    return pass_options()


# What it means when switching one pass off brings eager's result back, where there is more to say.
_PASS_HINTS = {
    "pattern_fusion_pass": ("Pattern fusion (pattern_fusion_pass) is the cause: a fused pattern computes something "
                            "else than the ops it replaced, beyond fused mode's tolerance. GRAPHEX_LOG=1 names the "
                            "patterns that fired; check the replacement of any pattern registered with "
                            "graphex.register_replacement against its search function. "),
}


def _guilty_passes(entry: Compiled, options: dict[str, Any], eager: RunResult) -> str:
    """Turn each enabled pass of the pipeline off in turn; name those whose absence brings back eager's result."""
    from ...options import Options
    from ...passes import is_on, switched_off

    effective = Options.from_user(options)
    guilty = []
    for name in bisected_passes():
        if not is_on(getattr(effective, name)):
            continue
        off = dict(options, **{name: switched_off(name)})
        diff: Diff = compare(eager, _run(entry, "force_eager", off))
        if diff.same:
            guilty.append(name)
    if not guilty:
        return "No single pass explains it (turning each off does not help). "
    names = " or ".join(f"options={{'{n}': {switched_off(n)}}}" for n in guilty)
    return f"With {names}, force_eager matches eager again. " + "".join(_PASS_HINTS.get(n, "") for n in guilty)
