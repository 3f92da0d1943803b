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


def first_line(text: str, limit: int = 200) -> str:
    line = str(text).strip().splitlines()[0] if str(text).strip() else ""
    return line if len(line) <= limit else line[: limit - 3] + "..."
