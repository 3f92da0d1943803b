"""Note [An exported program checks its shape guards]: a dynamic=True artifact run by graphex::Module (graphex._C.Module,
the loader graphex-run uses) with inputs that break a guard it was traced under is refused with an error naming the
guard; inputs that keep every guard give eager's result bit for bit. Before, the C++ runtime ran the program traced
for other shapes: `x * 2 if x.shape[0] > 4 else x + 1` exported at 8 rows gave x * 2 for 2 rows, silently."""

from __future__ import annotations

import os
import subprocess

import pytest
import torch
import torch.utils._pytree as pytree

import graphex
from graphex import _C
from graphex.program import encode as _spec
from graphex.errors import ProgramError, SignatureError
from graphex.exporting import ExportError, load_safetensors, safetensors_bytes
from graphex.inference import capture, shape_guards
from graphex.program import Binding
from graphex.options import Options
from graphex.runtime import live_graphs

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GRAPHEX_RUN = os.path.join(os.environ.get("GRAPHEX_BUILD_DIR") or os.path.join(ROOT, "build", "py"), "graphex-run")


def branch_on_rows(x):
    return x * 2 if x.shape[0] > 4 else x + 1


def pairs(x, y):  # reshape(-1, 2): the element count must be even
    return (x + y).reshape(-1, 2).sum(0)


def half(x, w):
    return (x @ w)[: x.shape[0] // 2]


def thirds(x):  # a view by x.shape[0] // 3: rows a multiple of 3 (and more)
    return x.view(x.shape[0] // 3, 3, -1).mean(1)


def broadcast_to_five(x, y):  # y's rows specialize to x's
    return (x + y).relu()


# (function, the example it is exported with, calls to try: shapes per argument)
CASES = [
    (branch_on_rows, [(8, 3)], [[(8, 3)], [(6, 3)], [(5, 3)], [(4, 3)], [(2, 3)], [(9, 2)]]),
    (pairs, [(4, 6), (6,)], [[(4, 6), (6,)], [(3, 4), (4,)], [(3, 3), (3,)], [(5, 2), (2,)], [(2, 5), (5,)]]),
    (half, [(8, 5), (5, 7)], [[(8, 5), (5, 7)], [(6, 3), (3, 2)], [(3, 5), (5, 7)], [(2, 5), (5, 7)]]),
    (thirds, [(9, 4)], [[(9, 4)], [(12, 4)], [(6, 2)], [(10, 4)], [(3, 4)], [(7, 4)]]),
    (broadcast_to_five, [(5, 4), (5, 4)], [[(5, 4), (5, 4)], [(7, 3), (7, 3)], [(5, 4), (1, 4)]]),
]


def _export(fn, example, tmp_path):
    torch.manual_seed(0)
    path = tmp_path / fn.__name__
    graphex.export(fn, [torch.randn(*s) for s in example], str(path), dynamic=True)
    return path


def _python_guards_hold(fn, example, args) -> bool:
    """What the trace's own guards (ShapeEnv's expression, evaluated in Python) say about `args`."""
    flat, in_spec = pytree.tree_flatten((tuple(torch.randn(*s) for s in example), {}))
    with torch.no_grad():
        _, entry, why = capture.compile_cold(fn, flat, in_spec, Options(), True, {}, with_guards=False)
    assert entry is not None, why
    from torch.fx.experimental.symbolic_shapes import SYMPY_INTERP

    inputs = []
    for b in entry.bindings:
        a = args[b.index]
        inputs.append(a if b.kind == "arg" else a.size(b.dim) if b.kind == "size" else
                      a.stride(b.dim) if b.kind == "stride" else a.storage_offset())
    text = entry.header["guards"]
    # ShapeEnv's own expression, evaluated as torch's guards are: the oracle the C++ check is compared with
    return not text or bool(eval(text, {**SYMPY_INTERP, "__builtins__": {}},
                                 {"L": {f"t{i}": v for i, v in enumerate(inputs)}}))


@pytest.mark.parametrize("fn, example, calls", CASES, ids=[c[0].__name__ for c in CASES])
def test_an_artifact_refuses_inputs_that_break_its_shape_guards_and_matches_eager_otherwise(fn, example, calls,
                                                                                           tmp_path):
    module = _C.Module(str(_export(fn, example, tmp_path)))
    refused = ran = 0
    for shapes in calls:
        torch.manual_seed(1)
        args = [torch.randn(*s) for s in shapes]
        holds = _python_guards_hold(fn, example, args)
        try:
            want = fn(*args)
        except RuntimeError:
            want = None  # eager itself refuses these shapes
        try:
            (got,) = module(args)
        except SignatureError as e:
            assert not holds, f"{fn.__name__}{shapes}: refused although every guard holds: {e}"
            assert "break a shape guard the program was traced under" in str(e) and "args[" in str(e), str(e)
            refused += 1
            continue
        assert holds, f"{fn.__name__}{shapes}: ran although a guard fails (a program traced for other shapes)"
        assert want is not None and torch.equal(got, want), f"{fn.__name__}{shapes}: differs from eager"
        ran += 1
    assert ran >= 1 and refused >= 1, (ran, refused)  # each case has shapes of both kinds


def test_graphex_run_refuses_them_too(tmp_path):
    assert os.path.exists(GRAPHEX_RUN), "graphex-run is not built: make build"
    path = _export(branch_on_rows, [(8, 3)], tmp_path)
    for rows, ok in ((6, True), (2, False)):
        x = torch.randn(rows, 3)
        (tmp_path / "in.safetensors").write_bytes(safetensors_bytes({"0": x}))
        out = tmp_path / "out.safetensors"
        proc = subprocess.run([GRAPHEX_RUN, str(path), "--inputs", str(tmp_path / "in.safetensors"), "--output",
                               str(out)], capture_output=True, text=True, timeout=120)
        if ok:
            assert proc.returncode == 0, proc.stderr
            assert torch.equal(load_safetensors(out)["0"], branch_on_rows(x))
        else:
            assert proc.returncode != 0 and "5 <= args[0].size(0)" in proc.stderr, proc.stderr


def test_a_guard_reading_an_input_the_program_lacks_is_refused_at_load(tmp_path):
    """A damaged or forged guard is a ProgramError when loading, never evaluated."""
    path = _export(branch_on_rows, [(8, 3)], tmp_path)
    flat, in_spec = pytree.tree_flatten(((torch.randn(8, 3),), {}))
    with torch.no_grad():
        _, entry, _ = capture.compile_cold(branch_on_rows, flat, in_spec, Options(), True, {}, with_guards=False)
    lowered = live_graphs()[-1].lowered  # the program the entry holds, to encode again with other guards

    def with_guards(*guards: shape_guards.ShapeGuard) -> None:
        (path / "program.gxp").write_bytes(_spec.encode(
            lowered.program, lowered.constants, bindings=entry.bindings,
            leaves=entry.leaves, tree=entry.header["outputs"]["spec"], guards=list(guards)))

    K, Op = shape_guards._K, shape_guards.GuardOp
    with_guards(shape_guards.ShapeGuard((Op(K.Const, value=1),), "1"))
    (got,) = _C.Module(str(path))([torch.ones(2, 3)])  # the encoder's program loads and runs
    assert torch.equal(got, torch.ones(2, 3) * 2)  # traced at 8 rows; the forged guard lets 2 through
    for guard, message in ((shape_guards.ShapeGuard((Op(K.Input, input=99),), "forged"), "reads program input 99"),
                           (shape_guards.ShapeGuard((Op(K.Apply, fn="Add", operands=2),), "forged"), "malformed"),
                           (shape_guards.ShapeGuard((Op(K.Size, input=2, dim=5),), "forged"), "dimension 5"),
                           (shape_guards.ShapeGuard((Op(K.Size, input=0),), "forged"), "not a tensor"),
                           (shape_guards.ShapeGuard((Op(K.Const), Op(K.Const)), "forged"), "malformed")):
        with_guards(guard)
        with pytest.raises(ProgramError, match=message):
            _C.Module(str(path))


def test_a_guard_the_runtime_cannot_evaluate_refuses_the_export(tmp_path, monkeypatch):
    def unsupported(text, bindings=None):
        raise shape_guards.Unsupported("shape guard 'sqrt(args[0].size(0)) > 2': cannot evaluate 'sqrt(...)'")

    monkeypatch.setattr(shape_guards, "from_expression", unsupported)
    with pytest.raises(ExportError, match="with dynamic=True: shape guard 'sqrt"):
        graphex.export(branch_on_rows, [torch.randn(8, 3)], str(tmp_path / "a"), dynamic=True)
    graphex.export(branch_on_rows, [torch.randn(8, 3)], str(tmp_path / "b"), dynamic=False)  # static: no guards


def test_guard_expressions_translate_to_postfix_or_say_why_not():
    (g,) = shape_guards.from_expression("5 <= L['t0']", [Binding("size", index=0, dim=0)])
    assert g.text == "5 <= args[0].size(0)"
    assert [op.kind for op in g.ops] == [shape_guards._K.Const, shape_guards._K.Input, shape_guards._K.Apply]
    guards = shape_guards.from_expression("L['t1'].size()[0] == L['t0'] and (L['t0'] % 2) == 0 and 1 < L['t0'] < 9",
                                          [Binding("size", index=0, dim=0), Binding("arg", index=0)])
    assert [g.text for g in guards] == ["args[0].size(0) == args[0].size(0)", "args[0].size(0) % 2 == 0",
                                        "1 < args[0].size(0) < 9"]
    for bad in ("sym_sqrt(L['t0']) > 2", "L['t0'] > 2.5", "L['x'] > 1", "Max(L['t0'], 1, 2) > 1"):
        with pytest.raises(shape_guards.Unsupported):
            shape_guards.from_expression(bad)


@pytest.mark.parametrize("dynamic", [True, False])
def test_the_printed_fix_exporting_again_at_the_refused_shape_runs_it(tmp_path, dynamic):
    """The refusal says: export again with examples of these shapes, or with dynamic=False. Both, applied, run the
    refused input and equal eager."""
    x = torch.randn(2, 3)
    with pytest.raises(SignatureError, match="export again with examples of these shapes, or with dynamic=False"):
        _C.Module(str(_export(branch_on_rows, [(8, 3)], tmp_path)))([x])
    path = tmp_path / "again"
    graphex.export(branch_on_rows, [torch.randn(2, 3)], str(path), dynamic=dynamic)
    (got,) = _C.Module(str(path))([x])
    assert torch.equal(got, branch_on_rows(x))
