"""What `graphex check` found, as text for a person or JSON for a program."""

from __future__ import annotations

import dataclasses
import json
import shlex
from typing import Any

from . import CHECKS

FORMAT_VERSION = 1


@dataclasses.dataclass
class Problem:
    op: str                   # "mylib::foo"
    check: str                # a name in CHECKS
    case: str                 # "mylib::foo#2": the recorded call that shows it
    expected: str
    seen: str
    fix: str                  # code to paste, in the op's registration style
    note: str = ""            # e.g. the rule a proposed fake follows
    also: list[str] = dataclasses.field(default_factory=list)  # other cases with the same problem

    @property
    def number(self) -> int:
        return CHECKS[self.check]


@dataclasses.dataclass
class OpResult:
    op: str
    style: str
    defined_at: str
    calls_seen: int
    cases: list[tuple[str, str]]        # (case id, inputs)
    status: dict[str, str]              # check name -> "pass" | "FAIL" | "skipped" | "n/a"


@dataclasses.dataclass
class Report:
    script: str
    argv: list[str]
    entry: str | None = None
    ops: list[OpResult] = dataclasses.field(default_factory=list)
    problems: list[Problem] = dataclasses.field(default_factory=list)
    traceback: str = ""       # set when the script itself failed
    failed_in: dict[str, str] = dataclasses.field(default_factory=dict)  # the custom op it failed in

    @property
    def exit_code(self) -> int:
        if self.traceback:
            return 2
        return 1 if self.problems else 0

    def add(self, problem: Problem) -> None:
        """The same op, check and fix on another case: one problem (shown for its first case), more cases."""
        for p in self.problems:
            if (p.op, p.check, p.fix) == (problem.op, problem.check, problem.fix):
                p.also.append(problem.case)
                return
        self.problems.append(problem)

    def rerun(self, case: str) -> str:
        entry = f" --entry {self.entry}" if self.entry else ""
        extra = f" -- {shlex.join(self.argv)}" if self.argv else ""
        return f"graphex check {shlex.quote(self.script)}{entry} --case {case}{extra}"


def text(report: Report) -> str:
    if report.traceback:
        text = (f"graphex check: the script failed (exit 2):\n"
                f"{report.traceback.rstrip()}\n")
        f = report.failed_in
        if f:
            text += f"\ngraphex check: it failed inside custom op {f['op']} ({f['inputs']}):\n  {f['why']}\n"
            if f.get("fix"):
                text += "  fix:\n" + "".join(f"    {line}\n" for line in f["fix"].splitlines())
        if not report.ops:
            return text
        text += "\ngraphex check: the custom ops it called before failing, checked on those calls:\n\n"
    else:
        text = ""
    lines = []
    for p in report.problems:
        lines.append(f"FAIL {p.op}: check {p.number} {p.check}   case {p.case}"
                     + (f" (also {', '.join(p.also)})" if p.also else ""))
        lines.append(_field("expected", p.expected))
        lines.append(_field("seen", p.seen))
        if p.note:
            lines.append(_field("note", p.note))
        lines.append(f"  re-run:   {report.rerun(p.case)}")
        lines.append("  fix:")
        lines.extend("    " + line for line in p.fix.splitlines())
        lines.append("")
    lines.append(_summary(report))
    return text + "\n".join(lines) + "\n"


def _field(name: str, value: str) -> str:
    head = f"  {name + ':':<9} "
    return head + value.replace("\n", "\n" + " " * len(head))


def _summary(report: Report) -> str:
    if not report.ops:
        return "graphex check: the script called no custom operator; nothing to check."
    marks = {"pass": "ok", "FAIL": "FAIL", "skipped": "-", "n/a": "n/a"}
    width = max(len(o.op) for o in report.ops)
    rows = [f"{'op':<{width}}  " + "  ".join(f"{n}.{name}" for name, n in CHECKS.items())]
    for o in report.ops:
        cells = [f"{marks[o.status.get(name, 'n/a')]:<{len(name) + len(str(n)) + 1}}" for name, n in CHECKS.items()]
        rows.append(f"{o.op:<{width}}  " + "  ".join(cells).rstrip())
    n_cases = sum(len(o.cases) for o in report.ops)
    verdict = (f"{len(report.problems)} problem(s) in {len({p.op for p in report.problems})} op(s)"
               if report.problems else "all checks passed")
    return "\n".join(rows) + f"\ngraphex check: {len(report.ops)} op(s), {n_cases} recorded case(s): {verdict}."


def as_json(report: Report) -> str:
    doc: dict[str, Any] = {
        "format_version": FORMAT_VERSION,
        "script": report.script,
        "argv": report.argv,
        "entry": report.entry,
        "exit_code": report.exit_code,
        "status": {0: "pass", 1: "fail", 2: "script_failed"}[report.exit_code],
        "checks": dict(CHECKS),
        "ops": [{"op": o.op, "style": o.style, "defined_at": o.defined_at, "calls_seen": o.calls_seen,
                 "cases": [{"id": c, "inputs": i} for c, i in o.cases], "status": o.status} for o in report.ops],
        "problems": [{"op": p.op, "check": p.check, "number": p.number, "case": p.case, "also": p.also,
                      "expected": p.expected, "seen": p.seen, "note": p.note, "fix": p.fix,
                      "rerun": report.rerun(p.case)} for p in report.problems],
    }
    if report.traceback:
        doc["traceback"] = report.traceback
        doc["failed_in"] = report.failed_in or None
    return json.dumps(doc, indent=2)
