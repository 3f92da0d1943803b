"""The record every analysis returns, and how a source location is written."""

from __future__ import annotations

import dataclasses
import linecache
import os
import re
import sys
from typing import Any

import torch

# Frames in these files are not the user's: torch, graphex (this tool included), runpy.
_INTERNAL = tuple(os.path.dirname(m.__file__) + os.sep for m in (torch, sys.modules["graphex"]) if m.__file__)
_RESUME = re.compile(r"torch_dynamo_resume_in_(\w+?)_at_(\d+)")

# Report order, and the heading of each kind.
KINDS = {
    "script": "script",
    "graph-break": "graph breaks",
    "recompile": "recompiles",
    "capture": "capture problems (graphex could not capture or run the graph)",
    "custom-op": "custom operators",
    "kept-copy": "copies kept (in-place updates not applied)",
    "accuracy": "accuracy",
}


@dataclasses.dataclass
class Finding:
    kind: str            # a key of KINDS
    title: str           # one line: what is wrong
    where: str = ""      # the user's source: "file.py:12 in forward: y = f(x)"
    fix: str = ""        # what to do; may be several lines (code to paste)
    detail: str = ""     # why / the evidence, one or a few lines
    problem: bool = True  # False: worth knowing, not a problem (does not set exit code 1)
    count: int = 1       # how many times it happened (recompiles of one kind, repeated copies)
    op: str = ""         # the operator concerned, 'ns::name.overload' or 'ns::name' ('' if none)
    node: str = ""       # the FX node concerned ('' if none)

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def short_path(path: str) -> str:
    """`path` relative to the working directory when it lies below it."""
    try:
        rel = os.path.relpath(path)
    except ValueError:
        return path
    return path if rel.startswith("..") else rel


def location(file: str, line: int, fn: str = "", code: str | None = None) -> str:
    """'file.py:12 in forward: y = f(x)'; the code is read from the file when not given."""
    if code is None:
        code = linecache.getline(file, line).strip()
    text = f"{short_path(file)}:{line}"
    if fn:
        text += f" in {fn}"
    return f"{text}: {code}" if code else text


def is_internal(filename: str) -> bool:
    return filename.startswith(_INTERNAL) or filename.startswith("<frozen")


def clean_fn(name: str) -> str:
    """Dynamo's resume functions by the user's name: 'f (resumed after line 8)'."""
    return _RESUME.sub(r"\1 (resumed after line \2)", name)


def root_error(e: BaseException) -> BaseException:
    """The error a wrapper stands for: Dynamo's BackendCompilerFailed wraps what the backend raised."""
    seen: set[int] = set()
    while id(e) not in seen:
        seen.add(id(e))
        inner = getattr(e, "inner_exception", None)
        if not isinstance(inner, BaseException):
            break
        e = inner
    return e


def error_line(e: BaseException, limit: int = 200) -> str:
    """'Type: first line' of the error a wrapper stands for (never a blank reason)."""
    e = root_error(e)
    text = first_line(_DYNAMO_TAIL.sub("", str(e)), limit)
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


# What Dynamo appends to errors it re-raises ("from user code: ...", "Set TORCHDYNAMO_VERBOSE ...").
_DYNAMO_TAIL = re.compile(r"\n\s*\n(from user code:|Set TORCHDYNAMO_VERBOSE).*$", re.S)


def first_line(text: str, limit: int = 200) -> str:
    line = next((line.strip() for line in str(text).splitlines() if line.strip()), "")
    return line if len(line) <= limit else line[: limit - 3] + "..."
