"""Graph breaks: where Dynamo had to stop the graph, why, and what to change.

Breaks come from two places: the graph-break log of the script's own run (compiled with
fullgraph=False, a break is silent), and the error a fullgraph=True compile raised at the
first break. In the second case the function is traced again from its first call's inputs
with fullgraph=False and the plain "eager" backend, so every break of the function is listed,
not only the first.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import re

import torch
from torch._dynamo.exc import Unsupported

from ...base.source import _FRAME
from ...custom_ops import reset_dynamo
from ...errors import CustomOpError
from .capture import from_error
from .dynamo_logs import DynamoLogs, LogEvent
from .findings import Finding, clean_fn, is_internal, location
from .runner import Compiled, ScriptRun

_LOGGED = re.compile(r"in user code at (?P<file>.+?):(?P<line>\d+)\nGraph Break Reason: (?P<reason>.*?)"
                     r"(?:\n+User code traceback:\n(?P<tb>.*))?$", re.S)
_PREAMBLE = re.compile(r"^(Encountered graph break when attempting to trace [^\n]*|Failed to handle graph break "
                       r"gracefully\. Skipping the function and falling back to eager\. Graph break encountered:)"
                       r"\s*\n", re.S)
_GENERIC_HINTS = ("report an issue", "fundamental", "Dynamo tracing rules", "TORCHDYNAMO_VERBOSE", "please visit")

# What a delayed break (torch 2.15) is called: the gb_type Dynamo gave it before.
_DELAYED_TITLES: list[tuple[str, str]] = [(r"RNN, GRU, or LSTM", "Attempted to wrap RNN, GRU, or LSTM")]

# (pattern on "gb_type\nreason", fix); the first that matches wins.
_FIXES: list[tuple[str, str]] = [
    (r"Attempted to wrap RNN|RNN, GRU, or LSTM",
     "set torch._dynamo.config.allow_rnn = True before the first call (or at the top of the script): Dynamo "
     "then traces RNN / GRU / LSTM into ATen ops that graphex captures and replays. Expect LSTM bitwise equal to "
     "eager and GRU equal within rounding (the same last-bit differences as backend='aot_eager': its cell is "
     "decomposed); the traced cells run step by step, so the model may be slower than eager's fused RNN kernel: "
     "measure before keeping it."),
    (r"Data-dependent branching|generic_jump",
     "make the branch data-independent: compute both sides and pick with torch.where(cond, a, b), or clamp "
     "instead of testing; if the condition is about sizes, test the shape (a Python int), or assert it with "
     "torch._check(...). Decisions that must stay data-dependent belong outside the compiled function "
     "(graphex cannot replay torch.cond)."),
    (r"Tensor\.item|capture_scalar_outputs|Tensor\.tolist|\.item\(\)",
     "keep the value on a tensor: use the 0-d tensor in tensor ops (x / t, torch.where) instead of "
     ".item()/.tolist()/float(t); if the Python number is really needed, compute it outside the compiled "
     "function and pass it in."),
    (r"`print`|builtin print|\bprint\b",
     "remove print() from the compiled region: print after the compiled call returns, or guard it with "
     "`if not torch.compiler.is_compiling():`."),
    (r"logging|Logger|warnings\.warn",
     "move logging/warnings out of the compiled function (or guard with torch.compiler.is_compiling())."),
    (r"Data dependent operator|Dynamic shape operator|nonzero|unique|masked_select",
     "the output size depends on tensor data: use a fixed-size form (a mask with torch.where, topk with a "
     "fixed k) or move this op outside the compiled function."),
    (r"numpy|np\.",
     "use torch ops instead of NumPy inside the compiled function."),
    (r"Failed to trace builtin operator|builtin",
     "replace the Python builtin with a torch op on tensors, or move that code outside the compiled function."),
    (r"marked as skipped|skipfiles|non-Tensor",
     "Dynamo does not trace into this function: call torch ops directly, or wrap the opaque code as a custom "
     "op with a fake function (`graphex new op NS::NAME --style custom_op`)."),
]


@dataclasses.dataclass
class _Break:
    gb_type: str
    reason: str
    file: str
    line: int
    fn: str
    code: str | None
    error: BaseException | None = None  # the break's own exception, when known

    @property
    def key(self) -> tuple[str, str, int]:
        return (self.gb_type, self.file, self.line)


def collect(run: ScriptRun, *, retrace: bool = True) -> list[Finding]:
    """Every graph break of every compiled function the script ran, with a fix each."""
    breaks: list[_Break] = [b for b in map(_from_log, run.events) if b is not None]
    for entry in run.compiled:
        if not is_graph_break(entry.error):
            continue
        first = _from_exception(entry.error)  # type: ignore[arg-type]
        if first is not None:
            breaks.append(first)
        if retrace and entry.first_args is not None:
            breaks.extend(b for b in map(_from_log, _retrace(entry)) if b is not None)
    findings: dict[tuple[str, str, int], Finding] = {}
    for b in breaks:
        if b.key in findings:
            continue
        findings[b.key] = _finding(b)
    return list(findings.values())


def is_graph_break(error: BaseException | None) -> bool:
    return (isinstance(error, Unsupported) and not isinstance(error, CustomOpError)
            and getattr(error, "gb_type", "") != "Dynamo recompile limit exceeded")


def _retrace(entry: Compiled) -> list[LogEvent]:
    """Trace the function again with fullgraph=False (backend "eager") and return its graph-break log."""
    reset_dynamo()
    args, kwargs = entry.fresh_inputs()
    quiet = io.StringIO()
    with contextlib.redirect_stdout(quiet), contextlib.redirect_stderr(quiet), DynamoLogs() as logs:
        try:
            with torch.no_grad():
                torch.compile(entry.target, backend="eager", fullgraph=False, dynamic=entry.dynamic)(*args, **kwargs)
        except Exception:  # breaks logged before a failure still count
            pass
    reset_dynamo()
    return [e for e in logs.events if e.kind == "graph-break"]


def _from_log(event: LogEvent) -> _Break | None:
    if event.kind != "graph-break":
        return None
    m = _LOGGED.search(event.message)
    if m is None:
        return None
    file, line, fn, code = m["file"], int(m["line"]), "", None
    frames = [f for f in _FRAME.finditer(m["tb"] or "") if not is_internal(f["file"])]
    if frames:
        last = frames[-1]
        file, line, fn, code = last["file"], int(last["line"]), last["fn"], last["code"].strip()
    gb_type, reason = _split_reason(m["reason"])
    return _Break(gb_type, reason, file, line, clean_fn(fn), code, event.exc)


def _from_exception(error: Unsupported) -> _Break | None:
    stack = [f for f in getattr(error, "real_stack", None) or [] if not is_internal(f.filename)]
    frame = stack[-1] if stack else getattr(error, "innermost_user_frame_summary", None)
    if frame is None:
        return None
    gb_type, reason = _split_reason(getattr(error, "msg", None) or str(error))
    gb_type = getattr(error, "gb_type", None) or gb_type
    return _Break(gb_type, reason, frame.filename, frame.lineno or 0, clean_fn(frame.name),
                  (frame.line or "").strip() or None, error)


def _split_reason(reason: str) -> tuple[str, str]:
    """(the break's type: its first line, the rest) with Dynamo's "Encountered graph break..." preamble removed."""
    text = _PREAMBLE.sub("", reason.strip())
    head, _, rest = text.partition("\n")
    return head.strip(), rest


def _explanation(reason: str) -> str:
    m = re.search(r"Explanation:\s*(.*?)(?:\n\s*\n|\n\s*Hint:|\n\s*Developer debug context:|$)", reason, re.S)
    text = " ".join(m[1].split()) if m else ""
    return text if len(text) <= 300 else text[:297] + "..."


def _dynamo_hint(reason: str) -> str:
    for m in re.finditer(r"Hint:\s*(.*)", reason):
        hint = m[1].strip()
        if not any(g in hint for g in _GENERIC_HINTS):
            return hint
    return ""


def _finding(b: _Break) -> Finding:
    where = location(b.file, b.line, b.fn, b.code)
    explained = from_error(b.error, where) if b.error is not None else None
    if explained is not None:  # graphex's own error (a custom op without a fake): its fields
        return explained
    text = f"{b.gb_type}\n{b.reason}"
    fix = next((fix for pattern, fix in _FIXES if re.search(pattern, text)), "")
    if not fix:
        fix = _dynamo_hint(b.reason) or "move this code outside the compiled function, or rewrite it with torch ops."
    return Finding("graph-break", _title(b), where=where, fix=fix, detail=_explanation(b.reason))


def _title(b: _Break) -> str:
    """Dynamo's graph-break type; a break Dynamo delays gets a generic one (torch 2.15 delays RNN/GRU/LSTM as
    'Unsupported function call (delayed)'), so a known break keeps the name it had (_DELAYED_TITLES)."""
    if "(delayed)" in b.gb_type:
        for pattern, title in _DELAYED_TITLES:
            if re.search(pattern, b.reason):
                return title
    return b.gb_type