"""The differential fuzzer (sweeps/fuzz*.py): a seeded run passes, failures shrink, reproducers re-run."""

from __future__ import annotations

import os
import subprocess
import sys

import torch

from conftest import ROOT
from sweeps import fuzz_run
from sweeps.fuzz_gen import Input, Program, generate, merge
from sweeps.fuzz_run import Outcome, check, make_inputs, shrink, write_reproducer


def test_generated_programs_are_deterministic_and_cover_the_menu():
    assert generate(7).source() == generate(7).source()
    text = "\n".join(generate(seed).source() for seed in range(300))
    for needle in ("index_put", "index_put_", "scatter", "index_copy", "torch.cat", ".split(", " @ ", "torch.mm",
                   "graphex_fuzz.scale", "graphex_fuzz.add_one_", ".mul_(", ".copy_(", ".sum(", ".transpose(",
                   ".diagonal()", "[1:]"):
        assert needle in text, needle
    inputs = [p.inputs for p in map(generate, range(300))]
    assert any(0 in i.shape for ins in inputs for i in ins)  # 0-size
    assert {i.layout for ins in inputs for i in ins} >= {"contiguous", "transposed", "sliced", "expanded"}
    assert {i.dtype for ins in inputs for i in ins} == {"float32", "float16", "bfloat16", "int64"}


def test_inputs_have_the_layouts_asked_for():
    t, s, e = make_inputs([Input((3, 4), "float32", "transposed"), Input((3, 4), "int64", "sliced"),
                           Input((3, 4), "float16", "expanded")], seed=0)
    assert not t.is_contiguous() and t.shape == (3, 4)
    assert s.stride() == (8, 2) and s.dtype == torch.int64
    assert e.stride()[0] == 0 and e.dtype == torch.float16


def test_a_program_writing_an_input_and_a_view_of_it_matches_eager():
    program = Program([Input((4, 3), "float32", "transposed"), Input((4, 3), "float32", "contiguous")], [
        "v0 = a0[1:]", "v0.mul_(2)", "torch.ops.graphex_fuzz.add_one_(a0.select(0, 0))",
        "a1.index_put_((torch.tensor([2, 0]),), (a1[:2] * 2).clone(), accumulate=True)", "v1 = torch.mm(a0, a1.t())",
    ], ["v1"])
    assert check(program, seed=3).kind == "ok"


def test_shrinking_keeps_only_what_the_failure_needs(monkeypatch, tmp_path):
    """A planted failure: any program that calls torch.exp "fails"; the shrunk program is that one line."""
    program = Program([Input((2, 3), "float32", "contiguous")],
                      ["v0 = torch.neg(a0)", "v1 = torch.exp(v0)", "v2 = v1 * 3", "a0.mul_(2)", "v3 = a0.sum()"],
                      ["v2", "v3"], dynamic=True)
    planted = Outcome("graphex_diff", "planted")
    monkeypatch.setattr(fuzz_run, "check", lambda p, seed, limit=30.0: planted if "exp" in p.source() else Outcome("ok"))
    small = shrink(program, 0, planted)
    assert small.statements == ["v1 = torch.exp(v0)"] or small.statements == ["v0 = torch.neg(a0)", "v1 = torch.exp(v0)"]
    assert small.dynamic is False and len(small.outputs) == 1
    path = write_reproducer(str(tmp_path), program, 5, planted)
    run = subprocess.run([sys.executable, path], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0 and "torch.exp(v0)" in run.stdout and run.stdout.strip().endswith("ok"), run.stderr


def test_merged_programs_keep_their_own_names_inputs_and_aliases():
    first = Program([Input((3, 2), "float32", "contiguous"), Input((2,), "float32", "alias_select")],
                    ["v0 = a0 + 1", "a1.mul_(2)"], ["v0"])
    second = Program([Input((2, 2), "int64", "contiguous"), Input((1, 2), "int64", "alias_slice")],
                     ["v0 = a1 * 3", "a0.add_(1)"], ["v0", "a0"])
    merged = merge([first, second])
    assert merged.statements == ["p0_v0 = a0 + 1", "a1.mul_(2)", "p1_v0 = a3 * 3", "a2.add_(1)"]
    assert merged.outputs == ["p0_v0", "p1_v0", "a2"]
    a0, a1, a2, a3 = make_inputs(merged.inputs, seed=0)
    assert a1.data_ptr() == a0.data_ptr() and a3.untyped_storage().data_ptr() == a2.untyped_storage().data_ptr()
    assert check(merged, seed=0).kind == "ok"


def test_seeded_fuzz_run_finds_no_graphex_failure(tmp_path):
    """160 programs from seed 0 in 40 graphs (about 30 s here); `make fuzz` runs 10,000."""
    proc = subprocess.run([sys.executable, "-m", "sweeps.fuzz", "--seed", "0", "--count", "160", "--batch", "4",
                           "--quick", "--out", str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONWARNINGS": "ignore"})
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert "fuzz: 160 programs" in proc.stdout and "graphex failures: 0" in proc.stdout
