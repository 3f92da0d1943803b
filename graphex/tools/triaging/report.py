"""The report: compact text grouped by kind with a one-line summary, or one JSON document (--json)."""

from __future__ import annotations

import dataclasses
import json
import textwrap
from typing import Any

from .bisect import STAGES, Bisection
from .findings import KINDS, Finding, short_path
from .runner import Compiled

FORMAT_VERSION = 1


@dataclasses.dataclass
class Report:
    script: str
    argv: list[str]
    entry: str | None
    status: str                      # "ran" | "failed" (under graphex only) | "failed-in-eager"
    error: str                       # the script's error, one line ("" if it ran)
    eager_error: str                 # the error without graphex (status failed-in-eager)
    compiled: list[Compiled]
    findings: list[Finding]
    bisections: list[Bisection]
    exit_code: int

    def summary(self) -> str:
        if self.status == "failed-in-eager":
            return "summary: the script fails in eager too (without graphex); fix it first"
        parts = []
        for kind in KINDS:
            n = sum(1 for f in self.findings if f.kind == kind and f.problem)
            if n:
                one, many = _LABELS[kind]
                parts.append(f"{n} {one if n == 1 else many}")
        text = ", ".join(parts) if parts else "nothing found"
        if self.bisections:
            stages = [_verdict(b) for b in self.bisections if b.culprit or b.failed_in_script]
            text += "; accuracy: " + (", ".join(stages) or "every stage matches eager bitwise")
        return f"summary: {text} (exit {self.exit_code})"


def _verdict(b: Bisection) -> str:
    if b.culprit:
        verdict = f"{b.name} {'raises' if b.raised else 'first differs'} at {b.culprit}"
        if b.verdict.startswith("graphex captured no graph"):
            verdict = f"{b.name}: graphex captured no graph (ran in eager)"
        return verdict
    return f"{b.name} failed in the script ({b.failed_in_script}), not compared as the script compiled it"


_LABELS = {"script": ("script error", "script errors"), "graph-break": ("graph break", "graph breaks"),
           "recompile": ("recompile cause", "recompile causes"), "capture": ("capture error", "capture errors"),
           "custom-op": ("custom-op error", "custom-op errors"), "kept-copy": ("kept copy", "kept copies"),
           "accuracy": ("accuracy problem", "accuracy problems")}


def text(report: Report) -> str:
    out = [f"graphex triage {short_path(report.script)}" + (f" --entry {report.entry}" if report.entry else "")]
    for c in report.compiled:
        opts = f", options={c.options!r}" if c.options else ""
        out.append(f"  compiled {c.name} at {c.compiled_at} (backend={_name(c.backend)}, fullgraph={c.fullgraph}, "
                   f"dynamic={c.dynamic}{opts}); called {c.calls}x")
    if not report.compiled:
        out.append("  the script called torch.compile on nothing (with --entry FUNC, FUNC may return (model, args))")
    if report.status == "failed-in-eager":
        out += ["", "the script fails without graphex too (torch.compile a no-op):",
                textwrap.indent(report.eager_error.strip(), "  ")]
    elif report.error:
        out.append(f"  the script stopped: {report.error}")
    for kind, heading in KINDS.items():
        found = [f for f in report.findings if f.kind == kind]
        if not found:
            continue
        out += ["", f"{heading} ({len(found)})"]
        for i, f in enumerate(found, 1):
            out.append(f"  [{i}] {f.title}" + ("" if f.problem else "  (note)"))
            out += _field("at", f.where) + _field("why", f.detail) + _field("fix", f.fix)
    if report.bisections:
        out += ["", "accuracy bisection (" + " -> ".join(STAGES) + "; first call's inputs, torch.no_grad())"]
        for b in report.bisections:
            out.append(f"  {b.name} (compiled at {b.compiled_at}):")
            if b.failed_in_script:
                out.append(f"      {'script':<11} failed: {b.failed_in_script}; the stages below are traced with "
                           "fullgraph=False")
            out += [f"      {stage:<11} {result}" for stage, result in b.stages.items()]
            if b.verdict and (not b.culprit or b.raised):
                out.append(f"      {b.verdict}")
    out += ["", report.summary()]
    return "\n".join(out) + "\n"


def _field(label: str, value: str) -> list[str]:
    if not value:
        return []
    lines = value.splitlines()
    return [f"      {label + ':':<5} {lines[0]}"] + [f"            {line}" for line in lines[1:]]


def _name(backend: Any) -> str:
    return backend if isinstance(backend, str) else getattr(backend, "__name__", repr(backend))


def as_json(report: Report) -> str:
    doc = {
        "version": FORMAT_VERSION,
        "script": report.script, "argv": report.argv, "entry": report.entry,
        "status": report.status, "error": report.error, "eager_error": report.eager_error,
        "compiled": [{"name": c.name, "compiled_at": c.compiled_at, "backend": _name(c.backend),
                      "options": {k: v if isinstance(v, (bool, int, float, str, type(None))) else repr(v)
                                  for k, v in (c.options or {}).items()},
                      "fullgraph": c.fullgraph, "dynamic": c.dynamic, "calls": c.calls} for c in report.compiled],
        "findings": [f.to_json() for f in report.findings],
        "bisections": [b.to_json() for b in report.bisections],
        "summary": report.summary(),
        "exit_code": report.exit_code,
    }
    return json.dumps(doc, indent=2, default=repr) + "\n"
