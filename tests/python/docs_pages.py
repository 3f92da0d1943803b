"""Reading the documentation's pages: their code fences, the markers that say how a fence is tested, and the
commands, flags and names they mention (tests/python/test_docs.py).

Note [Every example in the docs runs]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
README.md and every page under docs/ are read fence by fence:

- A ```python fence runs. The fences of one page run in order as one script in a fresh interpreter (the page with
  every other line blanked, so its line numbers are the page's), like a notebook
  (a later fence sees what an earlier one defined), in a temporary directory, with the repository on
  PYTHONPATH. A fence that should start from nothing is marked `<!-- docs-test: alone -->`.
- A shell fence (```sh, ```bash, ```console) is not run by default: every command in it is checked to exist
  (a `make` target in the Makefile, a `graphex` subcommand and each of its flags in its --help, a
  `python -m` module and its flags, a file of this repository, a GRAPHEX_* variable graphex reads).
  `<!-- docs-test: run -->` runs it as written; `<!-- docs-test: run-as: CMD -->` runs CMD instead, a cheap
  form of a command that takes long (`make bench` -> `python -m bench.run --quick ...`).
- `<!-- docs-test: skip: REASON -->` leaves a fence unrun; the page itself says why in words a reader sees
  (the test checks that the marker gives a reason).
- Other fences (```text, ```cpp, ```cmake, ...) are shown, not run.

The marker is an HTML comment on the line right above the fence: GitHub and MkDocs show nothing of it.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shlex

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
DOCS = os.path.join(ROOT, "docs")

PYTHON = ("python", "py")
SHELL = ("sh", "bash", "console", "shell")

_FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<tick>`{3,}|~{3,})(?P<info>[^\n`]*)\n(?P<body>.*?)^(?P=indent)(?P=tick)[ \t]*$",
                    re.M | re.S)
_MARKER = re.compile(r"<!--\s*docs-test:\s*(?P<what>[a-z-]+)\s*(?::\s*(?P<arg>.*?))?\s*-->\s*$")


@dataclasses.dataclass
class Fence:
    page: str          # path relative to the repository root
    line: int          # 1-based line of the opening ```
    lang: str          # the first word of the info string, lower case ('' when none)
    body: str          # the code, with the fence's own indentation removed
    marker: str = ""   # 'run', 'run-as', 'skip', 'alone' or ''
    marker_arg: str = ""

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"


def pages() -> list[str]:
    """README.md and every Markdown page under docs/, relative to the repository root."""
    found = ["README.md"]
    for folder, _, files in os.walk(DOCS):
        found += [os.path.relpath(os.path.join(folder, f), ROOT) for f in sorted(files) if f.endswith(".md")]
    return sorted(found, key=lambda p: (p != "README.md", p))


def read(page: str) -> str:
    with open(os.path.join(ROOT, page), encoding="utf-8") as f:
        return f.read()


def fences(page: str, text: str | None = None) -> list[Fence]:
    text = read(page) if text is None else text
    found = []
    for m in _FENCE.finditer(text):
        line = text.count("\n", 0, m.start()) + 1
        indent = m.group("indent")
        body = "\n".join(l[len(indent):] if l.startswith(indent) else l.lstrip() for l in m.group("body").split("\n"))
        info = m.group("info").strip()
        lang = info.split()[0].lower() if info else ""
        lang = lang.lstrip("{.").rstrip("}")
        fence = Fence(page, line, lang, body)
        before = text[:m.start()].rstrip("\n").rsplit("\n", 1)[-1]
        mk = _MARKER.search(before)
        if mk:
            fence.marker, fence.marker_arg = mk.group("what"), (mk.group("arg") or "").strip()
        found.append(fence)
    return found


def without_fences(text: str) -> str:
    """The page's prose (fences blanked, line numbers kept)."""
    return _FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text)


def shell_commands(body: str) -> list[list[str]]:
    """The commands of a shell fence, split into words: comments, prompts (`$ `), continuation lines and output
    lines of a ```console fence (those without a `$ ` prompt when any line has one) handled."""
    lines = body.split("\n")
    prompted = any(l.lstrip().startswith("$ ") for l in lines)
    commands, pending = [], ""
    for raw in lines:
        line = raw.strip()
        if prompted:
            if not line.startswith("$ ") and not pending:
                continue  # output
            line = line[2:] if line.startswith("$ ") else line
        if not line or line.startswith("#"):
            continue
        line = pending + line
        if line.endswith("\\"):
            pending = line[:-1] + " "
            continue
        pending = ""
        for part in re.split(r"\s*(?:&&|\|\||;)\s*", line):
            try:
                words = shlex.split(part, comments=True)
            except ValueError:
                words = part.split()
            if words:
                commands.append(words)
    return commands
