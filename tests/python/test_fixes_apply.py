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
# (rule known: needs_meta) and for an op with every kind of parameter (no rule: the TODO stops).
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
    source = "#include <torch/library.h>\\n#include <ATen/ATen.h>\\n" + skel + "\\n" + every + "\\n"
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
