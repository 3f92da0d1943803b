"""What graphex refused or could not do in place: capture errors, custom-op errors, kept copies.

graphex's own messages already name the op, the user's line and the fix (errors.py,
custom_ops/checks.py, lower.py); here they are cut into the report's fields, without the
text Dynamo appends ("from user code: ...", "Set TORCHDYNAMO_VERBOSE=1 ...").
"""

from __future__ import annotations

import re
import textwrap
from typing import Any

from ...errors import CaptureError, CustomOpError, GraphexError
from .findings import Finding, first_line
from .runner import ScriptRun

_DYNAMO_TAIL = re.compile(r"\n\s*\n(from user code:|Set TORCHDYNAMO_VERBOSE).*$", re.S)
_NODE_NAME = re.compile(r"'([A-Za-z_][\w]*)'|\(([A-Za-z_]\w*)\)")


def custom_op_finding(message: str, where: str = "") -> Finding:
    """A CustomOpError's message as a finding: the problem, where it is used, why, the fix (code)."""
    text = _DYNAMO_TAIL.sub("", message.strip())
    lines = text.splitlines()
    title = lines[0].removeprefix("graphex: ").rstrip(".") if lines else "custom op error"
    detail, fix, in_fix = [], [], False
    for line in lines[1:]:
        stripped = line.strip()
        if in_fix:
            fix.append(line)
        elif stripped.startswith("used at:"):
            where = stripped.removeprefix("used at:").strip()
        elif stripped == "fix:":
            in_fix = True
        elif stripped.startswith("why:"):
            detail.append(stripped.removeprefix("why:").strip())
        elif stripped.startswith("registered with"):
            detail.append(stripped)
    return Finding("custom-op", title, where=where, fix=textwrap.dedent("\n".join(fix)).strip(),
                   detail="\n".join(detail))


def capture_finding(message: str) -> Finding:
    """A CaptureError: 'graphex cannot capture node ...: what.\\n  from user code: ...\\n  fix: ...'."""
    text = _DYNAMO_TAIL.sub("", message.strip())
    where = re.search(r"^\s*from user code:\s*(.*)$", text, re.M)
    fix = re.search(r"^\s*fix:\s*(.*)", text, re.M | re.S)
    return Finding("capture", first_line(text, 300).removeprefix("graphex ").rstrip("."),
                   where=where[1].strip() if where else "", fix=fix[1].strip() if fix else "")


def error_findings(run: ScriptRun) -> list[Finding]:
    """Errors raised out of compiled calls, other than graph breaks (breaks.py reports those)."""
    from .breaks import is_graph_break

    findings = []
    for entry in run.compiled:
        e = entry.error
        if e is None or is_graph_break(e):
            continue
        fields = getattr(e, "finding", None)
        if isinstance(e, CustomOpError) and fields is not None:
            findings.append(Finding("custom-op", fields.what, where=fields.where or _frame_of(e), fix=fields.fix,
                                    detail="\n".join(filter(None, (fields.detail, fields.why)))))
        elif isinstance(e, CaptureError) and fields is not None:
            findings.append(Finding("capture", fields.what, where=fields.where, fix=fields.fix))
        elif isinstance(e, CustomOpError):
            findings.append(custom_op_finding(str(e), _frame_of(e)))
        elif isinstance(e, CaptureError):
            findings.append(capture_finding(str(e)))
        else:
            kind = "graphex error" if isinstance(e, GraphexError) else "error"
            findings.append(Finding(
                "capture", f"{entry.name}: {kind} {type(e).__name__}: {first_line(_DYNAMO_TAIL.sub('', str(e)))}",
                where=entry.error_call_at,
                fix=_fix_for_error(e), detail=f"raised by call {entry.error_call} of {entry.name} "
                                              f"(compiled at {entry.compiled_at})"))
    return findings


def _fix_for_error(e: BaseException) -> str:
    text = str(e)
    m = re.search(r"^\s*fix:\s*(.*)", text, re.M)
    if m:
        return m[1].strip()
    if "recompile_limit" in text or getattr(e, "gb_type", "") == "Dynamo recompile limit exceeded":
        return "see the recompiles section: make the changing input constant or dynamic."
    return "run the script with GRAPHEX_LOG=1 (and TORCHDYNAMO_VERBOSE=1) to see where it fails."


def _frame_of(e: BaseException) -> str:
    from .findings import location

    stack = getattr(e, "real_stack", None) or []
    if stack:
        f = stack[-1]
        return location(f.filename, f.lineno or 0, f.name, (f.line or "").strip() or None)
    return ""


def autograd_findings(run: ScriptRun) -> list[Finding]:
    """Compiled functions first called with autograd on: graphex ran them on AOTAutograd's eager path."""
    return [Finding("capture", f"{c.name} was called with grad enabled and tensors that require grad: graphex ran "
                               "it on AOTAutograd's eager path, not on the engine", where=c.first_call_at,
                    fix="for inference, call it under torch.no_grad() or torch.inference_mode() (or "
                        "requires_grad_(False) on the parameters).", problem=False)
            for c in run.compiled if c.first_needs_grad and c.is_graphex]


def kept_copy_findings(graphs: list[Any]) -> list[Finding]:
    """Every copy the replay still makes (CompiledGraph.kept_copies), once per distinct copy."""
    from ..._source import source_line

    found: dict[tuple[str, str], Finding] = {}
    for graph in graphs:
        nodes = {n.name: n for n in graph.gm.graph.nodes}
        for copy in graph.kept_copies:
            key = (copy.what, copy.reason)
            if key in found:
                found[key].count += 1
                continue
            where = ""
            for quoted, paren in _NODE_NAME.findall(copy.what):
                node = nodes.get(quoted or paren)
                if node is not None and source_line(node):
                    where = source_line(node)
                    break
            found[key] = Finding("kept-copy", f"{graph.name}: kept a copy of {copy.what}", where=where,
                                 fix=_fix_for_copy(copy.reason), detail=f"because {copy.reason}")
    return list(found.values())


def _fix_for_copy(reason: str) -> str:
    for option in ("input_inplace_pass", "inplace_pass"):
        if f"option {option}=False" in reason:
            return (f"remove options={{'{option}': False}} (the default is True): graphex then writes the "
                    "update in place instead of copying the whole tensor on every call.")
    if "reads its old value later" in reason:
        return ("move that read before the in-place update (or read the updated tensor instead): while the old "
                "value is still needed, the replay must copy the whole tensor on every call.")
    if "leave that input unchanged" in reason:
        return ("if the caller's tensor is meant to change, update it in the model (tensor.copy_(...), "
                "index_copy_, or a custom op that declares it in mutates_args); otherwise pass a tensor the op "
                "may own.")
    return "run with GRAPHEX_LOG=1 to see the graph around this copy; each kept copy costs a full copy per call."
