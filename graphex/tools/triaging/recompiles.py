"""Recompiles: which guard failed, on which call, and how to keep the graph stable.

Each recompile is one `TORCH_LOGS=recompiles` record: "Recompiling function F in FILE:LINE"
followed by the guard failures of the cached entries, newest first; the first is the one the
new call broke. graphex captures again on every recompile, so with dynamic=False each new
int value or shape is a new graph. Recompiles of one function for the same guarded value
are reported once, with a count.
"""

from __future__ import annotations

import re
from typing import Any

import torch

from ...base.source import _FRAME
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
     "the first call, so that one graph serves every size."),
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
     "'{name}' is a Python int whose value changes between calls, and with dynamic=False Dynamo bakes each value "
     "into a new graph. Keep it an int and let Dynamo treat it as dynamic: add the line "
     "torch.compiler.config.dynamic_sources = \"L['{name}']\" before the first call (tensor shapes stay static; "
     "slicing and indexing with it keep working), or compile with dynamic=True."),
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
        guard, used_at = _guard_and_use(event.message, guard_match, header["file"])
        category, name, fix = _classify(guard)
        entry = event.tag[0] if isinstance(event.tag, tuple) else None
        problem = True
        if category == "int value" and _int_is_dynamic(name, entry):  # Note [An int already marked dynamic]
            problem, fix = _specialized_anyway(guard, name, used_at)
        key = (f"{header['file']}:{header['line']}", category if problem else f"{category} (0/1)", name)
        if key in found:
            found[key].count += 1
            continue
        fn = f"{clean_fn(header['fn'])} ({short_path(header['file'])}:{header['line']})"
        call_site = event.tag[1] if isinstance(event.tag, tuple) else ""
        detail = f"guard failed: {guard}"
        if used_at:
            detail += f"\nthe guarded value is used at {used_at}"
        found[key] = Finding("recompile", f"{fn} recompiled: {category} changed", where=call_site or fn,
                             fix=fix, detail=detail, problem=problem)
    for finding in found.values():
        if finding.count > 1:
            finding.title += f" ({finding.count} recompiles)"
    return list(found.values())


def _int_is_dynamic(name: str, entry: Any) -> bool:
    """Was the int argument `name` already dynamic: compiled with dynamic=True, or named in dynamic_sources?"""
    if getattr(entry, "dynamic", None) is True:
        return True
    sources = [s.strip().split(":")[0] for s in str(torch.compiler.config.dynamic_sources or "").split(",")]
    source = f"L['{name}']"
    return any(s and (s == source or _matches(s, source)) for s in sources)


def _matches(pattern: str, source: str) -> bool:
    try:
        return re.match(pattern, source) is not None
    except re.error:
        return False


def _specialized_anyway(guard: str, name: str, used_at: str) -> tuple[bool, str]:
    """Note [An int already marked dynamic]
    With dynamic=True (or the int in torch.compiler.config.dynamic_sources) advising either
    again would be wrong. Dynamo still specializes such an int in two cases: the values 0
    and 1 (one extra graph each at most, then the int is symbolic: a note, not a problem),
    and uses that need a concrete value, e.g. `t[:, pos] = v`, where the fix is to rewrite
    the use with ops that take a symbolic int."""
    value = guard.rsplit("==", 1)[-1].strip()
    if value in ("0", "1"):
        return False, (f"nothing to do: Dynamo compiles the values 0 and 1 of a dynamic int ('{name}') as their own "
                       "graphs (0/1 specialization), then one graph serves every other value.")
    at = f" at {used_at}" if used_at else ""
    return True, (f"'{name}' is already dynamic (dynamic=True or dynamic_sources), but its use{at} makes Dynamo "
                  f"specialize it: indexing with an int (t[:, {name}], t[:, {name}] = v) needs its value. Write it "
                  f"with an op that takes a symbolic int: t.select(DIM, {name}) to read, "
                  f"t.select(DIM, {name}).copy_(v) to write (slices t[:, :{name} + 1] are fine); a Python if/while "
                  f"on '{name}' cannot stay dynamic: move it outside the compiled function.")


_COMMENT = re.compile(r"^\s*#\s*(?P<code>.*?)\s+#\s*(?P<file>\S+):(?P<line>\d+) in (?P<fn>\w+)")


def _guard_and_use(message: str, m: re.Match[str], fn_file: str) -> tuple[str, str]:
    """The guard text without its trailing '# code # file:line' comment, and where the value is used."""
    guard, _, comment = m["guard"].partition("  #")
    guard = guard.strip()
    c = _COMMENT.match("#" + comment) if comment else None
    if c is not None and fn_file.endswith(c["file"]):  # Dynamo shortens the file name: the function's own file
        return guard, f"{short_path(fn_file)}:{c['line']} in {clean_fn(c['fn'])}: {c['code']}"
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
