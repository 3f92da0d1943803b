"""Recompiles: which guard failed, on which call, and how to keep the graph stable.

Each recompile is one `TORCH_LOGS=recompiles` record: "Recompiling function F in FILE:LINE"
followed by the guard failures of the cached entries, newest first; the first is the one the
new call broke. graphex captures again on every recompile, so with dynamic=False each new
int value or shape is a new graph. Recompiles of one function for the same guarded value
are reported once, with a count.
"""

from __future__ import annotations

import re

from ..._source import _FRAME
from .dynamo_logs import LogEvent
from .findings import Finding, clean_fn, short_path

_HEADER = re.compile(r"Recompiling function (?P<fn>\S+) in (?P<file>.+?):(?P<line>\d+)")
_GUARD = re.compile(r"^\s*- (?P<id>\d+/\d+): (?P<guard>.*)$", re.M)
_LIMIT = re.compile(r"hit config\.(?P<limit>\w+) \((?P<n>\d+)\)\n\s*function: '(?P<fn>[^']+)' \((?P<where>[^)]+)\)"
                    r"(?:\n\s*last reason: (?P<reason>.*))?")

# (category, pattern on the guard text, fix template using the pattern's groups)
_CATEGORIES: list[tuple[str, str, str]] = [
    ("shape",
     r"tensor '(?P<name>[^']+)' size mismatch at index (?P<dim>\d+)\. expected (?P<old>\d+), actual (?P<new>\d+)",
     "input '{name}' changes size in dim {dim} ({old} -> {new}) and dynamic=False makes every size a new graph: "
     "pad it to one fixed size (or a few bucket sizes), or call torch._dynamo.mark_dynamic({name}, {dim}) before "
     "the first call (graphex then replays one capture per size, up to capture_limit)."),
    ("rank", r"tensor '(?P<name>[^']+)' rank mismatch",
     "input '{name}' changes its number of dimensions between calls: reshape it to one rank before calling."),
    ("stride", r"tensor '(?P<name>[^']+)' stride mismatch",
     "input '{name}' arrives with a different memory layout: pass it contiguous ({name}.contiguous()) every call."),
    ("dtype", r"tensor '(?P<name>[^']+)' dtype mismatch",
     "input '{name}' changes dtype between calls: cast it to one dtype before calling."),
    ("device", r"tensor '(?P<name>[^']+)' (?:device|dispatch key set) mismatch",
     "input '{name}' changes device (or grad mode) between calls: call with the same device, under torch.no_grad() "
     "every time."),
    ("requires_grad", r"tensor '(?P<name>[^']+)' requires_grad mismatch",
     "input '{name}' changes requires_grad between calls: call under torch.no_grad() (or detach it) every time."),
    ("grad mode", r"grad_mode|is_grad_enabled|GLOBAL_STATE",
     "grad mode (or another global torch setting) differs between calls: wrap every call in torch.no_grad()."),
    ("int value", r"^(?:L\[')?(?P<name>[A-Za-z_][\w.]*)(?:'\])? == (?P<old>-?\d+)\b",
     "'{name}' is a Python int whose value changes between calls; Dynamo bakes the value into the graph. Pass it "
     "as a tensor (torch.tensor({name})) or keep it constant; with dynamic=True it becomes symbolic (graphex then "
     "replays one capture per value, up to capture_limit)."),
    ("length", r"len\((?P<name>[^)]+)\) == (?P<old>\d+)",
     "the length of {name} changes between calls: pass a fixed number of items (pad) or one stacked tensor."),
    ("object", r"___check_obj_id|ID_MATCH|___check_type_id|TYPE_MATCH",
     "a different object (or type) is passed or read each call: compile once and reuse the same module, "
     "function and globals."),
]
_DEFAULT_FIX = "keep what this guard checks the same between calls (TORCH_LOGS=guards lists every guard)."


def collect(events: list[LogEvent]) -> list[Finding]:
    """One finding per (function, guarded value), in the order they first happened."""
    found: dict[tuple[str, str, str], Finding] = {}
    for event in events:
        if event.kind == "limit":
            finding = _limit_finding(event)
            if finding is not None:
                found.setdefault(("limit", finding.title, ""), finding)
            continue
        if event.kind != "recompile":
            continue
        header, guard_match = _HEADER.search(event.message), _GUARD.search(event.message)
        if header is None or guard_match is None:
            continue
        guard, used_at = _guard_and_use(event.message, guard_match)
        category, name, fix = _classify(guard)
        key = (f"{header['file']}:{header['line']}", category, name)
        if key in found:
            found[key].count += 1
            continue
        fn = f"{clean_fn(header['fn'])} ({short_path(header['file'])}:{header['line']})"
        call_site = event.tag[1] if isinstance(event.tag, tuple) else ""
        detail = f"guard failed: {guard}"
        if used_at:
            detail += f"\nthe guarded value is used at {used_at}"
        found[key] = Finding("recompile", f"{fn} recompiled: {category} changed", where=call_site or fn,
                             fix=fix, detail=detail)
    for finding in found.values():
        if finding.count > 1:
            finding.title += f" ({finding.count} recompiles)"
    return list(found.values())


def _guard_and_use(message: str, m: re.Match[str]) -> tuple[str, str]:
    """The guard text without its trailing '# code # file:line' comment, and where the value is used."""
    guard = m["guard"].split("  #", 1)[0].strip()
    rest = message[m.end():]
    nxt = _GUARD.search(rest)
    block = rest[: nxt.start()] if nxt else rest
    block = "\n".join(line.strip().removeprefix("-").rstrip() for line in block.splitlines())
    frames = list(_FRAME.finditer(block))
    if not frames:
        return guard, ""
    f = frames[-1]
    return guard, f"{short_path(f['file'])}:{f['line']} in {clean_fn(f['fn'])}: {f['code'].strip()}"


def _classify(guard: str) -> tuple[str, str, str]:
    for category, pattern, template in _CATEGORIES:
        m = re.search(pattern, guard)
        if m:
            groups = {k: v for k, v in m.groupdict().items() if v is not None}
            name = groups.get("name", "")
            return category, name, template.format_map(_Defaults(groups))
    return "guarded value", guard, _DEFAULT_FIX


class _Defaults(dict):
    def __missing__(self, key: str) -> str:
        return "?"


def _limit_finding(event: LogEvent) -> Finding | None:
    m = _LIMIT.search(event.message)
    if m is None:
        return None
    return Finding(
        "recompile", f"{clean_fn(m['fn'])} hit torch._dynamo.config.{m['limit']} ({m['n']}): later calls run eagerly, "
                     "not on graphex", where=short_path(m["where"]),
        fix="remove the cause of the recompiles listed above; raising the limit only hides them.",
        detail=f"last reason: {m['reason'].split('  #', 1)[0].strip()}" if m["reason"] else "")
