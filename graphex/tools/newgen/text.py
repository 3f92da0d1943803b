"""Small text helpers for the generators: signatures that wrap, string literals, indentation."""

from __future__ import annotations

import textwrap
from typing import Iterable

WIDTH = 100  # generated lines stay under this


def indent(lines: Iterable[str], by: int = 4) -> list[str]:
    pad = " " * by
    return [pad + line if line else line for line in lines]


def py_def(name: str, params: list[str], ret: str | None = None) -> list[str]:
    """`def name(params) -> ret:` on one line, or with the parameters on their own lines."""
    tail = f" -> {ret}:" if ret else ":"
    one_line = f"def {name}({', '.join(params)}){tail}"
    if len(one_line) <= WIDTH:
        return [one_line]
    inner = "    " + ", ".join(params)
    if len(inner) <= WIDTH:
        return [f"def {name}(", inner, f"){tail}"]
    return [f"def {name}(", *(f"    {p}," for p in params), f"){tail}"]


def cpp_fn(ret: str, name: str, params: list[str]) -> list[str]:
    """`ret name(params) {` on one line, or with the parameters aligned under the first."""
    one_line = f"{ret} {name}({', '.join(params)}) {{"
    if len(one_line) <= WIDTH:
        return [one_line]
    head = f"{ret} {name}("
    pad = " " * len(head)
    lines = [head + params[0] + ","]
    lines += [pad + p + "," for p in params[1:-1]]
    lines.append(pad + params[-1] + ") {")
    return lines


def py_call(func: str, args: list[str], indent_by: int = 0, labels: list[str] | None = None) -> list[str]:
    """`func(args)` on one line, or one argument per line (each followed by `# label`)."""
    one_line = f"{func}({', '.join(args)})"
    if indent_by + len(one_line) <= WIDTH:
        return [one_line]
    return [f"{func}(", *_one_per_line(args, labels), ")"]


def py_tuple(items: list[str], indent_by: int = 0, labels: list[str] | None = None) -> list[str]:
    """A tuple display on one line, or one item per line (each followed by `# label`)."""
    one_line = f"({items[0]},)" if len(items) == 1 else f"({', '.join(items)})"
    if indent_by + len(one_line) <= WIDTH:
        return [one_line]
    return ["(", *_one_per_line(items, labels), ")"]


def _one_per_line(items: list[str], labels: list[str] | None) -> list[str]:
    if labels is None:
        return [f"    {item}," for item in items]
    return [f"    {item}," if item == label or item.startswith(f"{label}=") else f"    {item},  # {label}"
            for item, label in zip(items, labels)]


def py_str(text: str) -> str:
    """A Python string literal, double-quoted unless the text holds double quotes."""
    return f'"{text}"' if '"' not in text and "\\" not in text else repr(text)


def cpp_str(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def camel(name: str) -> str:
    """my_op_ -> MyOp (for the reproducer's Module class)."""
    return "".join(part[:1].upper() + part[1:] for part in name.split("_") if part) or "Op"


def join(*blocks: list[str] | str) -> str:
    """Lines and lists of lines -> file text ending in one newline; "" is a blank line."""
    lines: list[str] = []
    for block in blocks:
        lines.extend([block] if isinstance(block, str) else block)
    return "\n".join(lines).rstrip("\n") + "\n"


def commented(code: str, comment: str, marker: str = "#", room: int = WIDTH - 8) -> list[str]:
    """`code  # comment` when it fits in room, else the comment on the line above."""
    line = f"{code}  {marker} {comment}"
    return [line] if len(line) <= room else [f"{marker} {comment[:1].upper()}{comment[1:]}.", code]


def comment_lines(text: str, marker: str = "#", room: int = WIDTH - 4) -> list[str]:
    """A comment wrapped to room columns."""
    return [f"{marker} {line}" for line in textwrap.wrap(text, room - len(marker) - 1)]
