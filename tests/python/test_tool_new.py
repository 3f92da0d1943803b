"""`graphex new`: what it generates runs and passes as written, and bad requests are refused.

Each generated op has its own namespace: an op cannot be registered twice in one process.
The generated repro.py and test_NAME.py of the main cases run in one subprocess per op, with
this venv's python (importing torch costs seconds, so not two); the cpp style builds its
extension once, in the op's directory, and both files load that build. Further signatures
run in this process: their generated test module is imported and its tests called.
"""

from __future__ import annotations

import ast
import builtins
import importlib.util
import os
import re
import subprocess
import sys

import pytest
import torch

import graphex.tools.new  # noqa: F401  (the module under test; fails loudly if it does not import)
from graphex.cli import main
from graphex.tools.newgen.spec import schema_type

TEMPLATE = "my_op(Tensor x, Tensor? y, Tensor[] z, float attr1, int attr2) -> Tensor"  # the op-plugin example

_LIBRARIES_KEPT: list = []  # Libraries that must outlive their test (test_printed_meta_skeleton_pastes_twice_and_for_two_ops)


def new(*argv: str) -> int:
    return main(["new", *argv])


def generate(out, qualname: str, style: str, *extra: str) -> None:
    assert new("op", qualname, "--style", style, "--out", str(out), *extra) == 0


def run_generated(out, name: str, **env_vars: str) -> str:
    """repro.py, then the generated pytest file, in one fresh interpreter; returns its output."""
    script = ("import runpy, sys, pytest\n"
              "runpy.run_path('repro.py', run_name='__main__')\n"
              f"sys.exit(pytest.main(['-q', '-p', 'no:cacheprovider', 'test_{name}.py']))\n")
    env = dict(os.environ, PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))
    env.pop("TORCH_EXTENSIONS_DIR", None)
    env.update(env_vars)
    env.pop("GRAPHEX_LOG", None)
    env.pop("GRAPHEX_DUMP", None)
    proc = subprocess.run([sys.executable, "-c", script], cwd=out, env=env, capture_output=True, text=True,
                          timeout=600)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"generated files failed in {out}:\n{output[-6000:]}"
    assert "graphex matches eager" in output and "2 passed" in output, output[-3000:]
    assert "DeprecationWarning" not in output, output[-3000:]  # generated tests run quietly
    return output


def run_in_process(out, name: str, monkeypatch) -> None:
    """Import the generated test module (which imports the registration) and call its tests."""
    monkeypatch.syspath_prepend(str(out))
    spec = importlib.util.spec_from_file_location(f"generated_test_{out.name}", out / f"test_{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.test_graphex_matches_eager()
    module.test_opcheck()


def assert_registered_as(namespace: str, name: str, signature: str) -> None:
    """The registered schema is the requested one (custom_op writes `int` as SymInt: same op here)."""
    def normalized(schema):
        args = [(a.name, schema_type(a.real_type).replace("SymInt", "int"), a.kwarg_only,
                 a.default_value if a.has_default_value() else "<none>", bool(a.alias_info and a.alias_info.is_write))
                for a in schema.arguments]
        return args, [schema_type(r.real_type) for r in schema.returns]

    actual = getattr(getattr(torch.ops, namespace), name).default._schema
    assert normalized(actual) == normalized(torch._C.parse_schema(signature)), str(actual)


def assert_no_unused_imports(path) -> None:
    """Every name a generated file imports is used (the registering imports say noqa: F401)."""
    text = path.read_text()
    tree = ast.parse(text)
    used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)) and "noqa: F401" not in text.splitlines()[node.lineno - 1]:
            for alias in node.names:
                bound = alias.asname or alias.name.split(".")[0]
                assert bound in used, f"{path.name}:{node.lineno}: {bound} is imported but not used"


# --- generated files run as written (subprocess) ------------------------------------------------

STYLES = ["custom_op", "library", "cpp"]


@pytest.mark.parametrize("inplace", [False, True], ids=["out_of_place", "inplace"])
@pytest.mark.parametrize("style", STYLES)
def test_default_op_runs(tmp_path, style, inplace):
    name = "scale_" if inplace else "scale"
    generate(tmp_path, f"gx_default_{style}_{int(inplace)}::{name}", style, *(["--inplace"] if inplace else []))
    output = run_generated(tmp_path, name)
    if style == "cpp":
        assert (tmp_path / "build" / f"gx_default_cpp_{int(inplace)}_{name}").is_dir()
    assert ("written in place" in output) == inplace


@pytest.mark.parametrize("style", STYLES)
def test_template_signature_runs(tmp_path, style):
    out = tmp_path / "op"
    generate(out, f"gx_template_{style}::my_op", style, "--signature", TEMPLATE)
    for path in out.glob("*.py"):
        assert_no_unused_imports(path)
    # The cpp style builds under $TORCH_EXTENSIONS_DIR when it is set, else in build/ next to the files.
    run_generated(out, "my_op", TORCH_EXTENSIONS_DIR=str(tmp_path / "ext"))
    if style == "cpp":
        assert (tmp_path / "ext" / "gx_template_cpp_my_op").is_dir() and not (out / "build").exists()


def test_docs_document_new_op_as_it_parses():
    """docs/tools.md's `graphex new` section: the usage names every option of `graphex new op` (--style required),
    and its example command is the one test_template_signature_runs generates and runs (library style)."""
    import argparse
    import shlex

    from graphex.cli import build_parser

    page = open(os.path.join(os.path.dirname(__file__), "..", "..", "docs", "tools.md"), encoding="utf-8").read()
    section = page.split("## `graphex new`", 1)[1].split("\n## ", 1)[0]
    assert "`--style` is required" in section
    usage = next(line for line in section.splitlines() if line.startswith("graphex new op NS::NAME"))
    def subcommand(parser, name):
        return next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[name]

    op = subcommand(subcommand(build_parser(), "new"), "op")
    options = {o for a in op._actions for o in a.option_strings if o not in ("-h", "--help")}
    assert set(re.findall(r"--[a-z-]+", usage)) == options
    assert "--style {custom_op,library,cpp}" in usage and "[--style" not in usage  # required: not in brackets
    example = section.split("```sh\n", 1)[1].split("```", 1)[0]
    command = shlex.split(example.split("\ncd ", 1)[0].replace("\\\n", " "))
    assert command == ["graphex", "new", "op", "mylib::my_op", "--style", "library", "--signature", TEMPLATE]
    assert all("--style" in line for line in page.splitlines() if "graphex new op " in line)
    build_parser().parse_args(command[1:])  # parses as pasted


# Two outputs, two written inputs and every other argument type the cpp style maps, in one build.
EVERY = ("every(Tensor x, Tensor(a!)? acc, Tensor(b!)[] outs, Tensor?[] maybe, int? i, int[] d, int[]? dims, "
         "SymInt s, SymInt[] sizes, float? f, float[] fs, bool b, bool? ob, str reduce, str? om, Scalar alpha, "
         "Scalar? oa, ScalarType st, ScalarType? ost, Device dev, Layout layout, MemoryFormat mf, "
         "*, float eps=1e-6) -> (Tensor, Tensor)")


def test_multi_output_every_type_runs_in_cpp(tmp_path):
    generate(tmp_path, "gx_every_cpp::every", "cpp", "--signature", EVERY)
    source = " ".join((tmp_path / "gx_every_cpp_every.cpp").read_text().split())
    assert ("std::tuple<at::Tensor, at::Tensor> every_cpu(const at::Tensor& x, const std::optional<at::Tensor>& acc, "
            "at::TensorList outs, const c10::List<std::optional<at::Tensor>>& maybe, std::optional<int64_t> i, "
            "at::IntArrayRef d, at::OptionalIntArrayRef dims, c10::SymInt s, c10::SymIntArrayRef sizes") in source
    output = run_generated(tmp_path, "every")
    assert "acc, outs written in place" in output


def test_two_cpp_ops_of_one_namespace_load_in_one_process(tmp_path):
    # Note [Generated C++ ops share their namespace]: with TORCH_LIBRARY in each file the second
    # load aborted the process ("Only a single TORCH_LIBRARY can be used to register the namespace").
    generate(tmp_path / "a", "gx_pair_cpp::first", "cpp")
    generate(tmp_path / "b", "gx_pair_cpp::second", "cpp", "--signature", "second(Tensor x, float alpha) -> Tensor")
    for path in (tmp_path / "a" / "gx_pair_cpp_first.cpp", tmp_path / "b" / "gx_pair_cpp_second.cpp"):
        source = path.read_text()
        assert "TORCH_LIBRARY_FRAGMENT(gx_pair_cpp, m)" in source and "TORCH_LIBRARY(gx_pair_cpp" not in source
    script = ("import sys, pytest\n"
              "sys.exit(pytest.main(['-q', '-p', 'no:cacheprovider', 'a/test_first.py', 'b/test_second.py']))\n")
    env = dict(os.environ, PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))
    for name in ("TORCH_EXTENSIONS_DIR", "GRAPHEX_LOG", "GRAPHEX_DUMP"):
        env.pop(name, None)
    proc = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=600)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0 and "4 passed" in output, output[-6000:]  # graphex == eager, and opcheck, per op


# --- more signatures, in this process -----------------------------------------------------------

SIGNATURES = {
    "multi": ("multi(Tensor x, int[] dims, bool flag, str mode, ScalarType? dtype=None, float eps=1e-6, *, "
              "Scalar alpha=1) -> (Tensor, Tensor)"),
    "listout": "listout(Tensor[] xs, float scale) -> Tensor[]",
    "update": "update(Tensor(a!) x, Tensor y) -> ()",
    "cache_write": "cache_write(Tensor(a!) cache, Tensor value, int pos) -> Tensor",
    "lists_": "lists_(Tensor(a!)[] caches, Tensor x, Tensor?[] extra) -> ()",
    "outvar": "outvar(Tensor x, *, Tensor(a!) out, float? alpha=None) -> ()",
    "maybe": "maybe(Tensor x, Tensor? bias=None, int[]? dims=None, str? mode=None, Device? where=None) -> Tensor",
    # every argument type custom_op takes (its annotations must give back this very schema)
    "typed": ("typed(Tensor x, Tensor(a!)? acc, Tensor?[] maybe, int? i, int[] d, int[]? dims, SymInt s, "
              "SymInt[] sizes, float? f, float[] fs, bool b, bool? ob, bool[] bs, str? om, Scalar alpha, Scalar? oa, "
              "ScalarType st, ScalarType? ost, Device dev, *, ScalarType dt=float64) -> (Tensor, Tensor, Tensor)"),
    # and what only Library takes: a list default, Layout
    "every": "every(Tensor x, int[] ks=[1, 2], Layout? layout=None) -> Tensor",
}


@pytest.mark.parametrize("style", ["custom_op", "library"])
@pytest.mark.parametrize("name", list(SIGNATURES))
def test_signature_in_process(tmp_path, monkeypatch, capsys, style, name):
    namespace = f"gx_sig_{style}"
    refusal = {"outvar": "keyword-only tensors (out)", "every": "cannot express the default of ks ([1, 2])"}
    if style == "custom_op" and name in refusal:
        argv = ["op", f"{namespace}::{name}", "--style", style, "--signature", SIGNATURES[name]]
        assert new(*argv, "--out", str(tmp_path)) == 2
        assert refusal[name] in capsys.readouterr().err
        return
    generate(tmp_path / name, f"{namespace}_{name}::{name}", style, "--signature", SIGNATURES[name])
    for path in (tmp_path / name).glob("*.py"):
        assert_no_unused_imports(path)
    run_in_process(tmp_path / name, name, monkeypatch)
    assert_registered_as(f"{namespace}_{name}", name, SIGNATURES[name])


def test_fake_is_final_only_when_it_follows_from_the_schema(tmp_path):
    generate(tmp_path / "a", "gx_fake::one", "custom_op", "--signature", "one(Tensor x, float s) -> Tensor")
    generate(tmp_path / "b", "gx_fake::two", "custom_op", "--signature", "two(Tensor x) -> (Tensor, Tensor)")
    generate(tmp_path / "c", "gx_fake::three_", "custom_op", "--inplace")
    one = (tmp_path / "a" / "gx_fake_one.py").read_text()
    two = (tmp_path / "b" / "gx_fake_two.py").read_text()
    three = (tmp_path / "c" / "gx_fake_three_.py").read_text()
    assert "return torch.empty_like(x)  # like x" in one and "TODO: derive" not in one
    assert "TODO: derive" in two and "return torch.empty_like(x), torch.empty_like(x)" in two
    assert 'mutates_args=("x",)' in three and "-> None:" in three and "return None" in three
    for text in (one, two, three):
        assert "<your implementation>" in text
        compile(text, "generated", "exec")


# --- reproducer templates ------------------------------------------------------------------------

def test_mre_standard_runs(tmp_path, capsys):
    assert new("mre", "--out", str(tmp_path)) == 0
    assert "python repro.py" in capsys.readouterr().out
    text = (tmp_path / "repro.py").read_text()
    assert 'backend="graphex"' in text and "def infer_one_step():" in text and "dummy_input" in text
    proc = subprocess.run([sys.executable, "repro.py"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and "matches eager exactly" in proc.stdout, proc.stdout + proc.stderr


def test_mre_cache_template(tmp_path):
    assert new("mre", "--cache", "--out", str(tmp_path)) == 0
    text = (tmp_path / "repro_cache.py").read_text()
    compile(text, "repro_cache.py", "exec")
    assert "self.cached_forward = graphex.inference.cache_compile(" in text and "def _forward(self" in text
    env = {k: v for k, v in os.environ.items() if k != "GRAPHEX_CACHE_DIR"}
    for _ in range(2):  # the second run loads what the first saved
        proc = subprocess.run([sys.executable, "repro_cache.py"], cwd=tmp_path, env=env, capture_output=True,
                              text=True, timeout=300)
        assert proc.returncode == 0 and "matches eager exactly" in proc.stdout, proc.stdout + proc.stderr
        assert any((tmp_path / ".graphex_cache").iterdir())


# --- refusals ------------------------------------------------------------------------------------

@pytest.mark.parametrize("argv, message", [
    (["gx_err::foo", "--style", "library", "--signature", "bar(Tensor x) -> Tensor"], "names 'bar'"),
    (["gx_err::foo", "--style", "library", "--signature", "other::foo(Tensor x) -> Tensor"], "names 'other::foo'"),
    (["gx_err::foo", "--style", "cpp", "--inplace", "--signature", "foo(Tensor x) -> Tensor"],
     "declares no mutable argument"),
    (["gx_err::foo", "--style", "custom_op", "--signature", "foo(Tensor(a!) x) -> Tensor(a!)"], "aliases an input"),
    (["gx_err::foo", "--style", "custom_op", "--signature", "foo(Tensor x, Layout l) -> Tensor"], "--style library"),
    (["gx_err::foo", "--style", "custom_op", "--signature", "foo(Tensor x, int[] d=[0]) -> Tensor"],
     "cannot express the default"),
    (["gx_err::foo", "--style", "library", "--signature", "foo.out(Tensor x) -> Tensor"], "overload"),
    (["gx_err::foo", "--style", "library", "--signature", "foo(int n) -> Tensor"], "no Tensor"),
    (["gx_err::foo", "--style", "library", "--signature", "foo(Tensor x -> Tensor"], "cannot parse"),
    (["not-a-name", "--style", "library"], "NAMESPACE::NAME"),
    (["gx_err::torch", "--style", "custom_op"], "would hide torch"),
    (["gx_err::foo", "--style", "library", "--signature", "foo(Tensor(a!) x, str mode) -> ()"], "named 'mode'"),
    (["gx_err::foo", "--style", "library", "--signature", "foo(Tensor(a!) x) -> Tensor[]"], "list returns"),
])
def test_bad_request_is_refused_and_writes_nothing(tmp_path, capsys, argv, message):
    out = tmp_path / "out"
    assert new("op", *argv, "--out", str(out)) == 2
    assert message in capsys.readouterr().err
    assert not out.exists()


def test_existing_files_are_kept_unless_forced(tmp_path, capsys):
    generate(tmp_path, "gx_force::op1", "library")
    (tmp_path / "repro.py").write_text("# mine\n")
    assert new("op", "gx_force::op1", "--style", "library", "--out", str(tmp_path)) == 2
    err = capsys.readouterr().err
    assert "refusing to overwrite" in err and "--force" in err
    assert (tmp_path / "repro.py").read_text() == "# mine\n"
    generate(tmp_path, "gx_force::op1", "library", "--force")
    assert "def infer_one_step" in (tmp_path / "repro.py").read_text()
    assert sorted(os.listdir(tmp_path)) == ["gx_force_op1.py", "repro.py", "test_op1.py"]  # no temporary files


def test_no_arguments_without_a_terminal_prints_usage(capsys):
    assert not sys.stdin.isatty()  # pytest's stdin
    assert new() == 2
    err = capsys.readouterr().err
    assert "graphex new op NS::NAME" in err and "graphex new mre" in err


# --- the questions on a terminal -----------------------------------------------------------------

@pytest.fixture
def terminal(monkeypatch, tmp_path):
    """In tmp_path; returns a function that fakes a TTY and feeds the answers to input()."""
    monkeypatch.chdir(tmp_path)

    def answer(*replies: str) -> None:
        # Called from the test body: capsys installs its streams only when the test starts.
        monkeypatch.setattr(sys.stdin, "isatty", lambda: True, raising=False)
        monkeypatch.setattr(sys.stdout, "isatty", lambda: True, raising=False)
        queue = list(replies)
        monkeypatch.setattr(builtins, "input", lambda prompt="": queue.pop(0))
    return answer


def test_terminal_new_op_generates_files(terminal, tmp_path, capsys):
    # state 1, library, in-place, a bad name first, then the default signature
    terminal("1", "2", "y", "bad name", "gx_tty::bump_", "")
    assert new() == 0
    out = capsys.readouterr().out
    assert "What state is your op in?" in out and "NAMESPACE::NAME" in out
    text = (tmp_path / "bump_" / "gx_tty_bump_.py").read_text()
    assert 'lib.define("bump_(Tensor(a!) x) -> ()")' in text


@pytest.mark.parametrize("style_choice, expected", [
    ("1", "@add.register_fake"),
    ("2", '_graphex_libs["gx_tty2"].impl("add", add_meta, "Meta", allow_override=True)'),
    ("3", "TORCH_LIBRARY_IMPL(gx_tty2, Meta, m)"),
])
def test_terminal_eager_op_gets_meta_skeleton_and_check(terminal, tmp_path, capsys, style_choice, expected):
    terminal("2", "4", style_choice, "n", "gx_tty2::add", "add(Tensor x, Tensor y) -> Tensor")
    assert new() == 0
    out = capsys.readouterr().out
    assert "How to tell" in out  # "4": not sure
    assert expected in out and "torch.empty_like(x)" in out
    assert "graphex check YOUR_SCRIPT.py" in out
    assert not os.listdir(tmp_path)


def test_printed_meta_skeleton_pastes_twice_and_for_two_ops():
    """The Meta skeleton `graphex new` prints for an op that works in eager (library style, and the Python
    alternative of the cpp style): pasted into one module twice per op, for two ops of one namespace, every op has
    its Meta function afterwards, on one Library (Note [A printed fix pastes twice])."""
    import gc

    from graphex.tools.newgen import plan
    from graphex.tools.newgen.spec import parse_op

    lib = torch.library.Library("gx_newpaste", "FRAGMENT")
    # kept for the process: a Library collected at the test's end takes its ops out of the dispatcher but not out of
    # torch.ops' cache, and torch 2.11's ONNX exporter, walking every op, then fails on the dangling packet in a
    # later test of the same worker (test_bench_peers.py: "gx_newpaste.first has no overload name 'default'")
    _LIBRARIES_KEPT.append(lib)
    module: dict = {"__name__": "gx_newpaste_script"}
    for name in ("first", "second"):
        lib.define(f"{name}(Tensor x, Tensor? y, float a) -> Tensor")
        lib.impl(name, lambda x, y, a: x * a, "CPU")
        code = plan.meta_skeleton(parse_op(f"gx_newpaste::{name}", f"{name}(Tensor x, Tensor? y, float a) -> Tensor"),
                                  "library")
        assert code.startswith("from typing import Optional\n\nimport torch\n"), code
        for _ in range(2):
            exec(compile(code, "<pasted>", "exec"), module)
    gc.collect()
    assert list(module["_graphex_libs"]) == ["gx_newpaste"]
    for name in ("first", "second"):
        out = getattr(torch.ops.gx_newpaste, name)(torch.empty(2, 3, device="meta"), None, 2.0)
        assert out.device.type == "meta" and out.shape == (2, 3)


def test_terminal_op_in_graph_goes_to_triage(terminal, capsys):
    terminal("3")
    assert new() == 0
    assert "graphex triage YOUR_SCRIPT.py" in capsys.readouterr().out
