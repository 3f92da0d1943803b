"""The documentation is true: every example in README.md and docs/ runs (Note [Every example in the docs runs],
docs_pages.py), every command, flag, option and variable it names exists, generated tables are current, figures
carry their date and commit, the README stays short, and the MkDocs site builds without a warning."""

from __future__ import annotations

import functools
import os
import re
import shlex
import shutil
import subprocess
import sys

import pytest

import docs_pages
from docs_pages import PYTHON, ROOT, SHELL

PAGES = docs_pages.pages()
GRAPHEX = [sys.executable, "-m", "graphex"]


def _env(tmp: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    env["GRAPHEX_CACHE_DIR"] = os.path.join(tmp, "graphex_cache")
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    env.pop("GRAPHEX_LOG", None)
    env.pop("GRAPHEX_DUMP", None)
    return env


# ---- Python fences ----------------------------------------------------------------------------------------------

def _python_runs(page: str) -> list[list[docs_pages.Fence]]:
    """The page's Python fences grouped into interpreter runs: the shared one first, then one per `alone` fence."""
    shared, alone = [], []
    for fence in docs_pages.fences(page):
        if fence.lang not in PYTHON or fence.marker == "skip":
            continue
        (alone.append([fence]) if fence.marker == "alone" else shared.append(fence))
    return ([shared] if shared else []) + alone


def _run_python(fences: list[docs_pages.Fence], tmp: str, timeout: int = 600) -> None:
    """Run the fences as one real script: the page with every line outside them blanked, so the script's line numbers
    are the page's (a traceback points at the page's line), `__main__` is a real module and `inspect.getsource` finds
    what a fence defined (cache_compile reads the source of what it compiles)."""
    page = fences[0].page
    lines = [""] * (max(f.line + f.body.count("\n") + 2 for f in fences) + 1)  # lines[k]: the page's line k
    for fence in fences:
        for i, code in enumerate(fence.body.split("\n")):
            lines[fence.line + 1 + i] = code  # the fence opens on line fence.line; its code starts on the next
    script = os.path.join(tmp, page.replace("/", "_").replace(".md", "_md.py"))
    with open(script, "w") as f:
        f.write("\n".join(lines[1:]) + "\n")
    proc = subprocess.run([sys.executable, script], cwd=tmp, env=_env(tmp), capture_output=True, text=True,
                          timeout=timeout)
    assert proc.returncode == 0, (f"{page}: an example failed (line numbers in {os.path.basename(script)} are the "
                                  f"page's)\n{proc.stdout[-4000:]}\n{proc.stderr[-8000:]}")


_PY_RUNS = [(page, i) for page in PAGES for i, _ in enumerate(_python_runs(page))]


@pytest.mark.parametrize("page,run", _PY_RUNS, ids=[f"{p}#{i}" for p, i in _PY_RUNS])
def test_python_examples_run(page: str, run: int, tmp_path) -> None:
    _run_python(_python_runs(page)[run], str(tmp_path))


# ---- Shell fences -----------------------------------------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def _make_targets() -> frozenset[str]:
    text = open(os.path.join(ROOT, "Makefile")).read()
    return frozenset(re.findall(r"^([A-Za-z0-9_.-]+)\s*:(?!=)", text, re.M))


@functools.lru_cache(maxsize=None)
def _help(*words: str) -> str:
    proc = subprocess.run([*words, "--help"], cwd=ROOT, env=_env(ROOT), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"`{' '.join(words)} --help` failed:\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


@functools.lru_cache(maxsize=None)
def _graphex_variables() -> frozenset[str]:
    names: set[str] = set()
    for top in ("graphex", "csrc", "bench", "scripts", "examples", "Makefile", "CMakeLists.txt"):
        path = os.path.join(ROOT, top)
        files = [path] if os.path.isfile(path) else [os.path.join(d, f) for d, _, fs in os.walk(path) for f in fs]
        for name in files:
            if name.endswith((".py", ".cpp", ".h", ".txt", "Makefile", ".cmake")):
                names.update(re.findall(r"GRAPHEX_[A-Z0-9_]+", open(name, errors="replace").read()))
    return frozenset(names)


def _flags(words: list[str]) -> list[str]:
    return [w.split("=", 1)[0] for w in words if w.startswith("--") and len(w) > 2]


def _command_problem(words: list[str]) -> str:
    """'' when the command names only things that exist, else what is missing."""
    while words and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", words[0]):  # VAR=value prefixes
        var = words.pop(0).split("=", 1)[0]
        if var.startswith("GRAPHEX_") and var not in _graphex_variables():
            return f"the variable {var} is read nowhere in graphex"
    if not words:
        return ""
    prog, rest = words[0], words[1:]
    if prog in ("python", "python3", ".venv/bin/python") or prog.endswith("/python"):
        if rest[:1] == ["-m"] and len(rest) > 1:
            module = rest[1]
            found = subprocess.run([sys.executable, "-c", f"import importlib.util as u, sys; "
                                    f"sys.exit(u.find_spec({module!r}) is None)"], cwd=ROOT, env=_env(ROOT)).returncode
            if found != 0:
                return f"no module {module}"
            if module == "graphex":
                return _command_problem(["graphex", *rest[2:]])
            flags = _flags(rest[2:])
            if flags:
                text = _help(sys.executable, "-m", module)
                missing = [f for f in flags if f not in text]
                return f"python -m {module} has no {', '.join(missing)}" if missing else ""
            return ""
        script = next((w for w in rest if not w.startswith("-")), None)
        if script and "/" in script and script.split("/")[0] in os.listdir(ROOT) and \
                not os.path.exists(os.path.join(ROOT, script)):
            return f"no file {script} in the repository"
        return ""
    if prog == "make":
        targets = [w for w in rest if not w.startswith("-") and "=" not in w]
        missing = [t for t in targets if t not in _make_targets()]
        return f"the Makefile has no target {', '.join(missing)}" if missing else ""
    if prog == "graphex":
        head = []
        for w in rest:
            if w.startswith("-"):
                break
            head.append(w)
        if head and not re.fullmatch(r"[a-z][a-z-]*", head[0]):
            return ""  # `graphex ...`, `graphex COMMAND`: a placeholder, not a command
        text = _help(*GRAPHEX, *head[:2]) if head else _help(*GRAPHEX)
        missing = [f for f in _flags(rest) if f not in text]
        return f"`graphex {' '.join(head[:2])}` has no {', '.join(missing)}" if missing else ""
    return ""


_SHELL = [f for page in PAGES for f in docs_pages.fences(page) if f.lang in SHELL]


@pytest.mark.parametrize("fence", _SHELL, ids=[f.where for f in _SHELL])
def test_shell_examples_name_what_exists(fence: docs_pages.Fence) -> None:
    problems = [f"`{' '.join(words)}`: {why}" for words in docs_pages.shell_commands(fence.body)
                if (why := _command_problem(list(words)))]
    assert not problems, f"{fence.where}: " + "; ".join(problems)


_RUN_SHELL = [f for f in _SHELL if f.marker in ("run", "run-as")]


def _script(fence: docs_pages.Fence) -> str:
    return fence.marker_arg if fence.marker == "run-as" else fence.body


# One run per distinct script: pages that show the same commands (the README's quick start and getting-started's)
# are checked by the same run, named after every place that shows it.
_BY_SCRIPT: dict[str, list[docs_pages.Fence]] = {}
for _f in _RUN_SHELL:
    _BY_SCRIPT.setdefault(_script(_f), []).append(_f)


@pytest.mark.parametrize("fences", list(_BY_SCRIPT.values()),
                         ids=[" & ".join(f.where for f in fs) for fs in _BY_SCRIPT.values()])
def test_shell_examples_marked_run_succeed(fences: list[docs_pages.Fence], tmp_path) -> None:
    script = _script(fences[0])
    where = ", ".join(f.where for f in fences)
    env = _env(str(tmp_path))
    env["DOCS_TMP"] = str(tmp_path)
    proc = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, f"{where}: `{script}` failed\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"


def test_every_marker_is_understood_and_a_skip_says_why() -> None:
    bad = []
    for page in PAGES:
        text = docs_pages.read(page)
        for m in re.finditer(r"<!--\s*docs-test:(.*?)-->", text, re.S):
            where = f"{page}:{text.count(chr(10), 0, m.start()) + 1}"
            mk = docs_pages._MARKER.search(m.group(0))
            if not mk or mk.group("what") not in ("run", "run-as", "skip", "alone"):
                bad.append(f"{where}: unknown marker {m.group(0)!r}")
            elif mk.group("what") in ("skip", "run-as") and not (mk.group("arg") or "").strip():
                bad.append(f"{where}: `{mk.group('what')}` needs {'a reason' if mk.group('what') == 'skip' else 'a command'}")
        for m in re.finditer(r"<!--\s*docs-test:.*?-->[ \t]*\n(?P<next>[ \t]*[`~]{3})?", text):
            if not m.group("next"):
                bad.append(f"{page}:{text.count(chr(10), 0, m.start()) + 1}: a docs-test marker must sit right above a fence")
    assert not bad, "\n".join(bad)


# ---- Names the prose mentions -----------------------------------------------------------------------------------

def test_named_commands_flags_and_variables_exist() -> None:
    """Inline `make X`, `graphex CMD --flag`, `python -m X` and GRAPHEX_* mentions name what exists."""
    problems = []
    for page in PAGES:
        prose = docs_pages.without_fences(docs_pages.read(page))
        for m in re.finditer(r"`((?:[A-Z_]+=\S+ )*(?:make|graphex|python -m) [^`]*)`", prose):
            try:
                words = shlex.split(m.group(1))
            except ValueError:
                continue
            why = _command_problem(words)
            if why:
                problems.append(f"{page}:{prose.count(chr(10), 0, m.start()) + 1}: `{m.group(1)}`: {why}")
        for var in set(re.findall(r"\bGRAPHEX_[A-Z0-9_]*[A-Z0-9]\b", prose)):
            if var not in _graphex_variables():
                problems.append(f"{page}: {var} is read nowhere in graphex")
    assert not problems, "\n".join(problems)


def test_options_passed_in_the_docs_are_options() -> None:
    from graphex.options import option_docs

    known = {name for name, _, _ in option_docs()} | {"guard_filter_fn"}  # torch's own, for Dynamo
    problems = []
    for page in PAGES:
        text = docs_pages.read(page)
        for m in re.finditer(r"options\s*=\s*\{([^{}]*)\}", text):
            for key in re.findall(r"[\"'](\w+)[\"']\s*:", m.group(1)):
                if key not in known:
                    problems.append(f"{page}:{text.count(chr(10), 0, m.start()) + 1}: no option {key!r}")
    assert not problems, "\n".join(problems)


# ---- Generated blocks, figures, the README ----------------------------------------------------------------------

def test_generated_blocks_are_current() -> None:
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "update_docs.py"), "--check"], cwd=ROOT,
                          env=_env(ROOT), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr


_TIME = re.compile(r"\d(?:[\d,.]*)\s?(?:us|µs|ms)\b")
_DATED = re.compile(r"\b20\d\d-\d\d-\d\d\b.*\b[0-9a-f]{7,40}\b|\b[0-9a-f]{7,40}\b.*\b20\d\d-\d\d-\d\d\b")


def test_every_table_of_timings_says_when_and_at_which_commit() -> None:
    """A table with times in it has, in its own section above it, a line with the run's date and commit."""
    problems = []
    for page in PAGES:
        lines = docs_pages.without_fences(docs_pages.read(page)).split("\n")
        section_start = 0
        i = 0
        while i < len(lines):
            if lines[i].startswith("#"):
                section_start = i
            if lines[i].lstrip().startswith("|"):
                j = i
                while j < len(lines) and lines[j].lstrip().startswith("|"):
                    j += 1
                table = "\n".join(lines[i:j])
                if _TIME.search(table) and not any(_DATED.search(l) for l in lines[section_start:j + 3]):
                    problems.append(f"{page}:{i + 1}: a table of timings with no 'YYYY-MM-DD ... commit' line above it")
                i = j
                continue
            i += 1
    assert not problems, "\n".join(problems)


def test_readme_is_short_and_its_links_resolve() -> None:
    text = docs_pages.read("README.md")
    assert len(text.split("\n")) <= 250, f"README.md has {len(text.split(chr(10)))} lines (at most 250: the rest goes in docs/)"
    missing = []
    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text):
        if "://" not in target and not os.path.exists(os.path.join(ROOT, target)):
            missing.append(target)
    assert not missing, f"README.md links to files that do not exist: {missing}"


def test_site_builds_without_a_warning(tmp_path) -> None:
    """`make docs`: MkDocs --strict (a broken link, a missing anchor, a page left out of the nav are errors)."""
    mkdocs = shutil.which("mkdocs", path=os.path.dirname(sys.executable))
    assert mkdocs, "mkdocs is not installed (make test installs tests/requirements.txt)"
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")  # Material's end-of-life banner, not a warning about our pages
    proc = subprocess.run([mkdocs, "build", "--strict", "-f", os.path.join(ROOT, "mkdocs.yml"), "-d", str(tmp_path / "site")],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    warnings = [l for l in proc.stderr.splitlines() if l.lstrip().startswith("WARNING")]
    assert not warnings, proc.stderr
    assert (tmp_path / "site" / "index.html").exists()
