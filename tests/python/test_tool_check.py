"""`graphex check`: each classic custom-op mistake is caught, named, located and fixed; correct ops pass.

Every script in check_scripts/ runs through `python -m graphex check` in its own process (an op
cannot be registered twice in one process; each script has its own namespace). The runs start
together, two at a time (importing torch costs seconds), in a module fixture. The fake proposer
is tested in this process on ops defined here: each proposed body is executed as a fake under
FakeTensorMode and must agree with the real kernel.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from graphex.custom_ops import fixes
from graphex.tools.checking.propose import propose

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPTS = os.path.join("tests", "python", "check_scripts")

# script -> {(op, check number, check name, case id): snippets the fix must contain}
MISTAKES = {
    "missing_fake_custom_op": {
        ("chk_mf_co::row_norm", 1, "fake_exists", "chk_mf_co::row_norm#1"):
            ["@row_norm.register_fake", "def _(x):", "return x.new_empty(x.shape[:-1])"]},
    "missing_fake_library": {
        ("chk_mf_lib::pairwise_add", 1, "fake_exists", "chk_mf_lib::pairwise_add#1"):
            ['_graphex_libs["chk_mf_lib"] = torch.library.Library("chk_mf_lib", "FRAGMENT")',
             '_graphex_libs["chk_mf_lib"].impl("pairwise_add", pairwise_add_meta, "Meta", allow_override=True)',
             "torch.empty(torch.broadcast_shapes(x.shape, y.shape), dtype=x.dtype, device=x.device)"]},
    "missing_fake_cpp": {
        ("graphex_examples::needs_meta", 1, "fake_exists", "graphex_examples::needs_meta#1"):
            ["TORCH_LIBRARY_IMPL(graphex_examples, Meta, m)", "return at::empty_like(x);",
             '_graphex_libs["graphex_examples"].impl("needs_meta", needs_meta_meta, "Meta", allow_override=True)',
             "return torch.empty_like(x)"]},
    "fake_wrong_shape": {
        ("chk_shape::sum_rows", 2, "fake_matches", "chk_shape::sum_rows#1"):
            ["@sum_rows.register_fake", "return x.new_empty(x.shape[:-1])"]},
    "fake_wrong_dtype": {
        ("chk_dtype::argmax_last", 2, "fake_matches", "chk_dtype::argmax_last#1"):
            ['_graphex_libs["chk_dtype"].impl("argmax_last", argmax_last_meta, "Meta", allow_override=True)',
             "x.new_empty(x.shape[:-1], dtype=torch.int64)"],
        ("graphex_examples::needs_meta", 2, "fake_matches", "graphex_examples::needs_meta#1"):
            ["return torch.empty_like(x)"]},
    "fake_real_device": {
        ("chk_dev::double_it", 2, "fake_matches", "chk_dev::double_it#1"):
            ["instead of on 'cpu'", "return torch.empty_like(x)"]},
    "undeclared_mutation": {
        ("chk_mut::update_and_scale", 3, "mutations_declared", "chk_mut::update_and_scale#1"):
            ['lib.define("update_and_scale(Tensor x, Tensor(a!) state, float momentum) -> Tensor")'],
        ("chk_mut::clamp_and_sum", 3, "mutations_declared", "chk_mut::clamp_and_sum#1"):
            ['@torch.library.custom_op("chk_mut::clamp_and_sum", mutates_args=("x",))']},
    "declared_not_mutated": {
        ("chk_decl::scaled", 3, "mutations_declared", "chk_decl::scaled#1"):
            ['@torch.library.custom_op("chk_decl::scaled", mutates_args=())']},
    "output_alias": {
        ("chk_alias::flat", 4, "no_output_alias", "chk_alias::flat#1"): ["return x.clone()"],
        ("chk_alias::maybe_identity", 4, "no_output_alias", "chk_alias::maybe_identity#2"): ["return x.clone()"]},
    "returns_mutated": {
        ("chk_retmut::add_", 4, "no_output_alias", "chk_retmut::add_#1"):
            ['lib.define("add_(Tensor(a!) x, Tensor y) -> ()")', "return None"]},
    "fake_reads_data": {
        ("chk_data::first_n", 5, "fake_reads_no_data", "chk_data::first_n#1"):
            ["@first_n.register_fake", "torch.library.get_ctx().new_dynamic_size()"]},
}

EXTRA_RUNS = {
    "correct": ["correct_ops.py"],
    "crash": ["crashes.py"],
    "custom_op_alias": ["custom_op_alias.py"],
    "json_entry": ["correct_ops.py", "--entry", "main", "--json"],
    "json_fail": ["output_alias.py", "--json"],
    "case": ["fake_wrong_dtype.py", "--case", "graphex_examples::needs_meta#1"],
}

HEADER = re.compile(r"^FAIL (?P<op>\S+): check (?P<n>\d) (?P<name>\w+)\s+case (?P<case>\S+)", re.MULTILINE)


def _check(args: list[str]) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    for var in ("GRAPHEX_LOG", "GRAPHEX_DUMP"):
        env.pop(var, None)
    script, *rest = args
    return subprocess.run([sys.executable, "-m", "graphex", "check", os.path.join(SCRIPTS, script), *rest],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def runs() -> dict[str, subprocess.CompletedProcess]:
    jobs = {name: [f"{name}.py"] for name in MISTAKES} | EXTRA_RUNS
    with ThreadPoolExecutor(max_workers=2) as pool:
        return dict(zip(jobs, pool.map(_check, jobs.values())))


def _problems(stdout: str) -> dict[tuple[str, int, str, str], str]:
    """(op, check number, check name, case) -> the text of that problem, from the text report."""
    found = {}
    heads = list(HEADER.finditer(stdout))
    for i, m in enumerate(heads):
        end = heads[i + 1].start() if i + 1 < len(heads) else len(stdout)
        found[(m["op"], int(m["n"]), m["name"], m["case"])] = stdout[m.start():end]
    return found


@pytest.mark.parametrize("script", list(MISTAKES))
def test_mistake_is_caught_with_its_fix(runs, script):
    proc = runs[script]
    out = proc.stdout
    assert proc.returncode == 1, f"exit {proc.returncode}\n{out}\n{proc.stderr[-3000:]}"
    problems = _problems(out)
    assert set(problems) == set(MISTAKES[script]), out  # each expected problem, and no other
    for key, snippets in MISTAKES[script].items():
        text = problems[key]
        assert "expected:" in text and "seen:" in text, text
        assert f"--case {key[3]}" in text, text  # re-runnable
        for snippet in snippets:
            assert snippet in text, f"missing {snippet!r} in:\n{text}"


def test_missing_fake_proposal_says_how_it_was_inferred(runs):
    out = runs["missing_fake_custom_op"].stdout
    assert "inferred: x with dim -1 reduced, dtype of x (verified on" in out


def test_correct_ops_pass(runs):
    proc = runs["correct"]
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    assert "FAIL" not in proc.stdout and "all checks passed" in proc.stdout
    for op in ("chk_ok::gelu_scale", "chk_ok::scale_", "chk_ok::my_op", "chk_ok::stats", "chk_ok::add_into_",
               "graphex_examples::rms_norm", "graphex_examples::kv_cache_update_", "graphex_examples::scale_rows_"):
        assert op in proc.stdout
    assert "graph_matches_eager" in proc.stderr  # progress: the compile check ran


def test_crashing_script_exits_2_with_its_traceback(runs):
    proc = runs["crash"]
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "the script failed" in proc.stdout
    assert "crashes.py\", line 17, in main" in proc.stdout
    # the script's own error line (torch 2.15 prefixes the op's name: "RuntimeError: mm: mat1 and mat2 ...")
    assert re.search(r"^RuntimeError: (mm: )?mat1 and mat2 shapes cannot be multiplied \(2x3 and 4x5\)$",
                     proc.stdout, re.MULTILINE), proc.stdout
    assert "record.py" not in proc.stdout  # our recorder's frames are not the user's problem
    assert "it failed inside custom op chk_crash::mm (a=f32[2, 3], b=f32[4, 5])" in proc.stdout
    # the call that worked before the crash is still checked, and reported
    assert "the custom ops it called before failing, checked on those calls" in proc.stdout
    assert re.search(r"^chk_crash::mm\s+ok\s+ok\s+ok\s+ok\s+ok\s+ok$", proc.stdout, re.MULTILINE), proc.stdout


def test_custom_op_returning_a_view_fails_in_eager_with_check_4_named(runs):
    proc = runs["custom_op_alias"]
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "it failed inside custom op chk_coal::flatten (x=f32[2, 3])" in proc.stdout
    assert "check 4 no_output_alias" in proc.stdout and "return x.clone()" in proc.stdout


def test_json_report(runs):
    passed = json.loads(runs["json_entry"].stdout)
    assert runs["json_entry"].returncode == 0 and passed["status"] == "pass" and passed["entry"] == "main"
    assert passed["problems"] == [] and len(passed["ops"]) == 10
    assert all(s == "pass" for o in passed["ops"] for s in o["status"].values())

    failed = json.loads(runs["json_fail"].stdout)
    assert runs["json_fail"].returncode == 1 and failed["status"] == "fail" and failed["format_version"] == 1
    problem = next(p for p in failed["problems"] if p["op"] == "chk_alias::flat")
    assert problem["check"] == "no_output_alias" and problem["number"] == 4
    assert problem["case"] == "chk_alias::flat#1" and "return x.clone()" in problem["fix"]
    assert problem["rerun"].endswith("--case chk_alias::flat#1")
    op = next(o for o in failed["ops"] if o["op"] == "chk_alias::maybe_identity")
    assert [c["id"] for c in op["cases"]] == ["chk_alias::maybe_identity#1", "chk_alias::maybe_identity#2"]


def test_case_reruns_only_that_call(runs):
    proc = runs["case"]
    assert proc.returncode == 1, proc.stdout + proc.stderr[-3000:]
    assert set(_problems(proc.stdout)) == {("graphex_examples::needs_meta", 2, "fake_matches",
                                            "graphex_examples::needs_meta#1")}
    assert "chk_dtype::argmax_last" not in proc.stdout


# -- the fake proposer, in this process -----------------------------------------------------------
_lib = torch.library.Library("chk_unit", "FRAGMENT")
_KERNELS = {
    "same(Tensor x) -> Tensor": lambda x: x.sin(),
    "bcast(Tensor x, Tensor y) -> Tensor": lambda x, y: x * y,
    "rowsum(Tensor x) -> Tensor": lambda x: x.sum(1),
    "meank(Tensor x) -> Tensor": lambda x: x.mean(-1, keepdim=True),
    "argmax(Tensor x) -> Tensor": lambda x: x.argmax(-1),
    "cat(Tensor[] z) -> Tensor": lambda z: torch.cat(z, 1),
    "transpose(Tensor x) -> Tensor": lambda x: x.transpose(0, 1).contiguous(),
    "linear(Tensor x, Tensor w) -> Tensor": lambda x, w: torch.nn.functional.linear(x, w),
    "minmax(Tensor x) -> (Tensor, Tensor)": lambda x: (x.amin(0), (x > 0).sum(0)),
    "fixed(Tensor x) -> Tensor": lambda x: torch.zeros(2, 2, dtype=torch.float64),
    "nonzero(Tensor x) -> Tensor": lambda x: x.nonzero(),
    "fill_(Tensor(a!) x) -> ()": lambda x: x.fill_(0) and None,
}
for _schema, _fn in _KERNELS.items():
    _lib.define(_schema)
    _lib.impl(_schema.split("(")[0], _fn, "CPU")

X = torch.randn(3, 4)
PROPOSER_CASES = [  # op, recorded args, the returned expression
    ("same", (X,), "torch.empty_like(x)"),
    ("bcast", (X, torch.randn(4)),
     "torch.empty(torch.broadcast_shapes(x.shape, y.shape), dtype=x.dtype, device=x.device)"),
    ("rowsum", (torch.randn(2, 5, 3),), "x.new_empty(x.shape[:1] + x.shape[2:])"),
    ("meank", (X,), "x.new_empty((*x.shape[:-1], 1))"),
    ("argmax", (X,), "x.new_empty(x.shape[:-1], dtype=torch.int64)"),
    ("cat", ([X, torch.randn(3, 2)],), "z[0].new_empty((*z[0].shape[:-1], sum(t.shape[1] for t in z)))"),
    ("transpose", (torch.randn(2, 5),), "x.new_empty(x.transpose(0, 1).shape)"),
    ("linear", (X, torch.randn(6, 4)), "x.new_empty((*x.shape[:-1], w.shape[0]))"),
    ("minmax", (X,), "(x.new_empty(x.shape[1:]), x.new_empty(x.shape[1:], dtype=torch.int64))"),
    ("fixed", (X,), "x.new_empty((2, 2), dtype=torch.float64)"),
]


@pytest.mark.parametrize("name,args,expr", PROPOSER_CASES, ids=[c[0] for c in PROPOSER_CASES])
def test_proposer_infers_the_shape_rule(name, args, expr):
    op = getattr(torch.ops.chk_unit, name).default
    proposal = propose(op, args)
    assert proposal.body == f"    return {expr}", proposal.note()
    assert proposal.probes >= 3, proposal.note()
    # the proposed body works as a fake, on inputs other than the recorded ones
    namespace = {"torch": torch}
    params = ", ".join(a.name for a in op._schema.arguments)
    exec(f"def fake({params}):\n{proposal.body}", namespace)  # noqa: S102
    bigger = [[torch.randn(*(s + 1 for s in t.shape)) for t in a] if isinstance(a, list) else
              torch.randn(*(s + 1 for s in a.shape)) for a in args]
    if name == "cat":
        bigger = [[torch.randn(4, 5), torch.randn(4, 1)]]
    if name in ("bcast", "linear"):
        bigger = [torch.randn(5, 7), torch.randn(7) if name == "bcast" else torch.randn(2, 7)]
    real = op(*bigger)
    with FakeTensorMode() as mode:
        fake = namespace["fake"](*[[mode.from_tensor(t) for t in a] if isinstance(a, list) else mode.from_tensor(a)
                                   for a in bigger])
    for r, f in zip(real if isinstance(real, tuple) else (real,), fake if isinstance(fake, tuple) else (fake,)):
        assert (r.shape, r.dtype) == (f.shape, f.dtype)


def test_proposer_says_plainly_when_no_rule_fits():
    proposal = propose(torch.ops.chk_unit.nonzero.default, (torch.tensor([0.0, 1.0, 2.0]),))
    assert proposal.body is None
    assert proposal.note().startswith("no shape rule fits")


def test_proposer_inplace_returns_none():
    proposal = propose(torch.ops.chk_unit.fill_.default, (torch.ones(3),))
    assert proposal.body.strip().startswith("return None")


def test_schema_text_declares_and_drops_writes():
    schema = torch._C.parse_schema("ns::f(Tensor x, Tensor(a!) y, Tensor[] z, float eps=1e-06) -> Tensor")
    assert fixes.schema_text(schema, write=("x", "z")) == \
        "f(Tensor(b!) x, Tensor(a!) y, Tensor(c!)[] z, float eps=1e-06) -> Tensor"
    assert fixes.schema_text(schema, unwrite=("y",), returns="()") == \
        "f(Tensor x, Tensor y, Tensor[] z, float eps=1e-06) -> ()"
