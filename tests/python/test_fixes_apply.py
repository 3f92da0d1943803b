"""Every fix `graphex check` prints works: applied to the script, `check` then passes.

For each mistake in check_scripts/ the fix is taken from a real `graphex check` report (one
in-process check per script, in one subprocess: importing torch costs seconds), pasted the
way its text says (a new fake before `if __name__`, a replaced `define` line or decorator, a
replaced fake, a `return` line), and the fixed script is checked again: no problem left, every
check (the graphex compile against eager included) passes. The C++ Meta skeleton is compiled
once (slow) and run the same way.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPTS = os.path.join(ROOT, "tests", "python", "check_scripts")

# In one process: check each script given, print {script: [{"op", "check", "fix", "note"}...]} as JSON.
_DRIVER = textwrap.dedent("""\
    import contextlib, json, sys
    from graphex.tools.checking import report as reporting, suite
    from graphex.tools.checking.record import ScriptFailed, run_script
    found = {}
    for path in sys.argv[1:]:
        report = reporting.Report(path, [])
        try:
            with contextlib.redirect_stdout(sys.stderr):
                suite.run(run_script(path, [], None, 3), report)
        except ScriptFailed as e:
            found[path] = [{"op": "?", "check": "script_failed", "fix": str(e), "note": ""}]
            continue
        found[path] = [{"op": p.op, "check": p.check, "fix": p.fix, "note": p.note} for p in report.problems]
    print(json.dumps(found))
""")


def _check_in_one_process(paths: list[str], prelude: str = "") -> dict[str, list[dict]]:
    env = {k: v for k, v in os.environ.items() if k not in ("GRAPHEX_LOG", "GRAPHEX_DUMP")}
    proc = subprocess.run([sys.executable, "-c", prelude + _DRIVER, *paths], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _insert(text: str, fix: str) -> str:
    """Paste a new fake before `if __name__`."""
    return text.replace('if __name__ == "__main__":', fix + '\n\n\nif __name__ == "__main__":')


def _replace_block(text: str, head: str, fix: str) -> str:
    """Replace the decorated function starting at line `head` by `fix`."""
    m = re.search(rf"^{re.escape(head)}\n(?:.+\n)+?\n", text, re.MULTILINE)
    assert m, head
    return text[:m.start()] + fix + "\n\n" + text[m.end():]


def _replace_line(text: str, start: str, new: str) -> str:
    m = re.search(rf"^([ ]*){re.escape(start)}.*$", text, re.MULTILINE)
    assert m, start
    return text[:m.start()] + m[1] + new.strip() + text[m.end():]


def _line(fix: str, start: str) -> str:
    return next(line for line in fix.splitlines() if line.lstrip().startswith(start)).strip()


def _apply_returns_mutated(text: str, fix: str) -> str:
    text = _replace_line(text, "lib.define(", _line(fix, "lib.define("))
    text = text.replace("    x.add_(y)\n    return x\n", "    x.add_(y)\n")  # the kernel: "return None"
    return _replace_line(text, "return x", _line(fix, "return None"))   # the Meta function


def _apply_output_alias(text: str, fix: str) -> str:
    assert "return x.clone()" in fix
    text = text.replace("return x.view(-1)  # a view of x", "return x.view(-1).clone()")
    return text.replace("return x * 2 if apply else x  #", "return x * 2 if apply else x.clone()  #")


# script -> {(op, check): how the printed fix is pasted}
APPLY = {
    "missing_fake_custom_op": {("chk_mf_co::row_norm", "fake_exists"): _insert},
    "missing_fake_library": {("chk_mf_lib::pairwise_add", "fake_exists"): _insert},
    "fake_wrong_shape": {("chk_shape::sum_rows", "fake_matches"):
                         lambda t, f: _replace_block(t, "@sum_rows.register_fake", f)},
    "fake_real_device": {("chk_dev::double_it", "fake_matches"):
                         lambda t, f: _replace_line(t, "return torch.empty(x.shape)", _line(f, "return"))},
    "undeclared_mutation": {
        ("chk_mut::update_and_scale", "mutations_declared"):
            lambda t, f: _replace_line(t, 'lib.define("update_and_scale', _line(f, "lib.define(")),
        ("chk_mut::clamp_and_sum", "mutations_declared"):
            lambda t, f: _replace_line(t, '@torch.library.custom_op("chk_mut::clamp_and_sum"', f.splitlines()[0])},
    "declared_not_mutated": {("chk_decl::scaled", "mutations_declared"):
                             lambda t, f: _replace_line(t, '@torch.library.custom_op("chk_decl', f.splitlines()[0])},
    "returns_mutated": {("chk_retmut::add_", "no_output_alias"): _apply_returns_mutated},
    "output_alias": {("chk_alias::flat", "no_output_alias"): _apply_output_alias,
                     ("chk_alias::maybe_identity", "no_output_alias"): lambda t, f: t},  # both in one edit
    "fake_reads_data": {("chk_data::first_n", "fake_reads_no_data"):
                        lambda t, f: _replace_block(t, "@first_n.register_fake", f)},
}


def test_every_fix_check_prints_works_when_applied(tmp_path):
    originals = {name: os.path.join(SCRIPTS, f"{name}.py") for name in APPLY}
    before = _check_in_one_process(list(originals.values()))
    fixed_paths = []
    for name, path in originals.items():
        problems = {(p["op"], p["check"]): p["fix"] for p in before[path]}
        assert set(problems) == set(APPLY[name]), (name, before[path])
        text = open(path).read()
        for key, apply in APPLY[name].items():
            text = apply(text, problems[key])
        fixed = tmp_path / f"{name}.py"
        fixed.write_text(text)
        fixed_paths.append(str(fixed))
    after = _check_in_one_process(fixed_paths)
    for path in fixed_paths:
        assert after[path] == [], f"{path} still fails after its fix:\n{after[path]}\n{open(path).read()}"


# The no-rule case: the fix is a marked TODO that stops loudly, never an `empty_like` guess.
NO_RULE = '''\
import torch

lib = torch.library.Library("chk_norule", "FRAGMENT")
lib.define("tiled(Tensor x, int n) -> Tensor")


@torch.library.impl(lib, "tiled", "CPU")
def tiled(x, n):
    return x.reshape(-1).repeat(2)  # numel * 2: no candidate rule has it


if __name__ == "__main__":
    print(torch.ops.chk_norule.tiled(torch.randn(3, 5), 2).shape)
'''


def test_no_rule_fits_gives_a_marked_todo_not_empty_like(tmp_path):
    script = tmp_path / "no_rule.py"
    script.write_text(NO_RULE)
    [problem] = _check_in_one_process([str(script)])[str(script)]
    assert problem["check"] == "fake_exists"
    assert "empty_like" not in problem["fix"], problem["fix"]
    assert "TODO: graphex could not infer the output shape of chk_norule::tiled" in problem["fix"]
    assert 'raise NotImplementedError("TODO' in problem["fix"]
    # the note says what was seen: the recorded input and what the kernel returned
    assert "no shape rule fits" in problem["note"] and "on x=f32[3, 5], n=2 it returned f32[30]" in problem["note"]


# One compile: the C++ Meta skeletons `check` and the missing-fake error print, for the example op
# (rule known: needs_meta; pasted twice, includes and all) and for an op with every kind of parameter
# (no rule: the TODO stops).
_CPP_PRELUDE = textwrap.dedent("""\
    import dataclasses, os, sys, torch
    from torch.utils import cpp_extension
    sys.path.insert(0, os.getcwd())
    from examples import ops
    from graphex.custom_ops import fixes
    from graphex.custom_ops.registration import describe
    from graphex.tools.checking.propose import propose
    ops.load()
    lib = torch.library.Library("gx_cppskel", "FRAGMENT")
    lib.define("every(Tensor(a!) x, Tensor? y, Tensor[] z, float a, int b, int[] c, str d, bool e, "
               "Scalar s) -> (Tensor, Tensor)")
    op = torch.ops.graphex_examples.needs_meta.default
    skel = fixes.cpp_meta_skeleton(describe(op), propose(op, (torch.randn(3, 5),)).body.strip()[len("return "):])
    every = fixes.cpp_meta_skeleton(dataclasses.replace(describe(torch.ops.gx_cppskel.every.default),
                                                        style="cpp"), unknown="no rule")
    assert "TORCH_CHECK(false" in every and "empty_like" not in every, every
    assert skel.startswith("#include <ATen/ATen.h>\\n#include <torch/library.h>\\n#ifndef "), skel
    source = skel + "\\n" + skel + "\\n" + every + "\\n"  # pasted twice: the #ifndef compiles it once
    print(source, file=sys.stderr)
    cpp_extension.load_inline("gx_cpp_meta_skeleton", [source], extra_cflags=["-O0"],
                              is_python_module=False, build_directory=os.environ["GX_BUILD"])
    with torch.no_grad():
        try:
            torch.compile(lambda x: torch.ops.gx_cppskel.every(x, None, [x], 1.0, 2, [1], "d", True, 3),
                          backend="graphex", fullgraph=True)(torch.randn(2))
            raise AssertionError("the TODO skeleton must stop")
        except Exception as e:
            assert "TODO: the output shape of gx_cppskel::every" in str(e), e
""")


def test_cpp_meta_skeleton_compiles_and_the_script_then_passes(tmp_path):
    os.environ["GX_BUILD"] = str(tmp_path)
    try:
        found = _check_in_one_process([os.path.join(SCRIPTS, "missing_fake_cpp.py")], prelude=_CPP_PRELUDE)
    finally:
        del os.environ["GX_BUILD"]
    assert list(found.values()) == [[]], found


# -- every fix that adds code pastes as it is, also twice and for several ops of one namespace ---------------------
# Note [A printed fix pastes twice] (fixes.py). Each script below has a mistake; its fixes come from a real check (one
# process for all), are pasted as their text says, once and twice, and the script is then run in a fresh
# interpreter: its own eager run, then the model compiled with backend="graphex", against eager, bit for bit, after a
# gc.collect() (a Library that nothing keeps alive would take its registrations with it).
PASTE_SCRIPTS = {
    "custom_op": ('''\
import torch


@torch.library.custom_op("gx_paste_co::tanh_mul", mutates_args=(), device_types="cpu")
def tanh_mul(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return torch.tanh(x) * w


def model(x, w):
    return torch.ops.gx_paste_co.tanh_mul(x, w) + 1


if __name__ == "__main__":
    print(model(torch.randn(4, 3), torch.randn(4, 3)).shape)
''', "torch.randn(4, 3), torch.randn(4, 3)", None),
    # two ops of one namespace without a Meta function; the script's Library is not called `lib`
    "two_library_ops": ('''\
import torch

ops_lib = torch.library.Library("gx_paste_lib", "FRAGMENT")
ops_lib.define("pair_add(Tensor x, Tensor y) -> Tensor")
ops_lib.define("row_sum(Tensor x) -> Tensor")


@torch.library.impl(ops_lib, "pair_add", "CPU")
def pair_add(x, y):
    return x + y


@torch.library.impl(ops_lib, "row_sum", "CPU")
def row_sum(x):
    return x.sum(-1)


def model(x, y):
    return torch.ops.gx_paste_lib.row_sum(torch.ops.gx_paste_lib.pair_add(x, y)) * 2


if __name__ == "__main__":
    print(model(torch.randn(4, 3), torch.randn(4, 3)).shape)
''', "torch.randn(4, 3), torch.randn(4, 3)", "gx_paste_lib"),
    # an in-place op that returns its mutated input, its Meta registered on the defining Library (no `meta_lib`)
    "in_place_return": ('''\
import torch

my_ops = torch.library.Library("gx_paste_inp", "FRAGMENT")
my_ops.define("add_(Tensor(a!) x, Tensor y) -> Tensor(a!)")


@torch.library.impl(my_ops, "add_", "CPU")
def add_(x, y):
    x.add_(y)
    return x


def add_meta(x, y):
    return x


my_ops.impl("add_", add_meta, "Meta")


def model(cache, y):
    torch.ops.gx_paste_inp.add_(cache, y)
    return cache * 2


if __name__ == "__main__":
    print(model(torch.zeros(4, 3), torch.ones(4, 3)).shape)
''', "torch.zeros(4, 3), torch.randn(4, 3)", "gx_paste_inp"),
    # the op-plugin blocks pasted one after the other: `m` rebound, scale's Meta function collected
    "vanished_meta": ('''\
import torch
from torch.library import Library, impl

lib = Library("gx_paste_van", "FRAGMENT")
lib.define("scale(Tensor x, float s) -> Tensor")
lib.define("shift(Tensor x, float s) -> Tensor")
lib.impl("scale", lambda x, s: x * s, "CPU")
lib.impl("shift", lambda x, s: x + s, "CPU")

m = Library("gx_paste_van", "IMPL", "Meta")


@impl(m, "scale")
def scale_meta(x, s):
    return torch.empty_like(x)


m = Library("gx_paste_van", "IMPL", "Meta")


@impl(m, "shift")
def shift_meta(x, s):
    return torch.empty_like(x)


def model(x):
    return torch.ops.gx_paste_van.shift(torch.ops.gx_paste_van.scale(x, 2.0), 1.0)


if __name__ == "__main__":
    print(model(torch.randn(4, 3)).shape)
''', "torch.randn(4, 3)", "gx_paste_van"),
}

_VERIFY = '''

if __name__ == "__main__":
    import gc

    gc.collect()
    torch.manual_seed(0)
    inputs = [{inputs}]
    eager_inputs, graphex_inputs = [t.clone() for t in inputs], [t.clone() for t in inputs]
    with torch.no_grad():
        expected = model(*eager_inputs)
        got = torch.compile(model, backend="graphex", fullgraph=True, dynamic=False)(*graphex_inputs)
    assert torch.equal(got, expected), (got, expected)
    assert all(torch.equal(a, b) for a, b in zip(graphex_inputs, eager_inputs))  # written inputs too
    libs = globals().get("_graphex_libs", {{}})
    assert sorted(libs) == sorted({namespaces}), libs  # one Library per namespace, however often pasted
    print("graphex matches eager")
'''


def _paste_before_main(text: str, fix: str) -> str:
    return text.replace('if __name__ == "__main__":', fix + '\n\n\nif __name__ == "__main__":', 1)


def _pasted(name: str, text: str, fixes_: dict[tuple[str, str], str], times: int) -> str:
    """The script with its printed fixes pasted `times` times, as each fix's text says."""
    for _ in range(times):
        if name == "in_place_return":
            fix = fixes_[("gx_paste_inp::add_", "no_output_alias")]
            assert "meta_lib" not in fix and "\nimport torch\n" in fix, fix
            # 1. the schema line replaces the user's define, on the user's own Library (`my_ops`, not `lib`)
            text = _replace_line(text, 'my_ops.define("add_(', _line(fix, "my_ops.define("))
            # 2. the kernel returns None, as the fix says; 3. the Meta function pasted (it overrides the user's)
            text = text.replace("    x.add_(y)\n    return x\n", "    x.add_(y)\n")
            text = _paste_before_main(text, fix[fix.index("import torch"):])
        elif name == "vanished_meta":
            fix = fixes_[("gx_paste_van::scale", "fake_exists")]
            assert "registered on `m`" in fix and "def scale_meta(x, s):\n    return torch.empty_like(x)" in fix, fix
            block = '@impl(m, "scale")\ndef scale_meta(x, s):\n    return torch.empty_like(x)\n'
            # in place of the user's registration (the first time), then again below the first paste
            text = text.replace(block, fix + "\n") if block in text else _paste_before_main(text, fix)
        else:
            for fix in fixes_.values():
                assert fix.startswith("import torch\n"), fix
                text = _paste_before_main(text, fix)
    return text


@pytest.fixture(scope="module")
def paste_fixes(tmp_path_factory) -> dict[str, dict[tuple[str, str], str]]:
    folder = tmp_path_factory.mktemp("paste")
    paths = {}
    for name, (text, _, _) in PASTE_SCRIPTS.items():
        paths[name] = folder / f"{name}.py"
        paths[name].write_text(text)
    found = _check_in_one_process([str(p) for p in paths.values()])
    return {name: {(p["op"], p["check"]): p["fix"] for p in found[str(path)]} for name, path in paths.items()}


def test_paste_scripts_have_the_mistakes_they_should(paste_fixes):
    assert {name: sorted(found) for name, found in paste_fixes.items()} == {
        "custom_op": [("gx_paste_co::tanh_mul", "fake_exists")],
        "two_library_ops": [("gx_paste_lib::pair_add", "fake_exists"), ("gx_paste_lib::row_sum", "fake_exists")],
        "in_place_return": [("gx_paste_inp::add_", "no_output_alias")],
        "vanished_meta": [("gx_paste_van::scale", "fake_exists")],
    }


@pytest.mark.parametrize("times", [1, 2])
@pytest.mark.parametrize("name", list(PASTE_SCRIPTS))
def test_printed_fix_pasted_runs_and_compiles_bitwise(paste_fixes, tmp_path, name, times):
    text, inputs, namespace = PASTE_SCRIPTS[name]
    script = _pasted(name, text, paste_fixes[name], times)
    script += _VERIFY.format(inputs=inputs, namespaces=[namespace] if namespace else [])
    path = tmp_path / f"{name}_x{times}.py"
    path.write_text(script)
    env = {k: v for k, v in os.environ.items() if k not in ("GRAPHEX_LOG", "GRAPHEX_DUMP")}
    proc = subprocess.run([sys.executable, str(path)], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0 and "graphex matches eager" in proc.stdout, \
        f"{script}\n--- stdout\n{proc.stdout[-3000:]}\n--- stderr\n{proc.stderr[-4000:]}"
