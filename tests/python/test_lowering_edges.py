"""Graphs the OpInfo sweep found graphex-only failures in: effect tokens (linalg), operator packets left by
passes (scatters), and control flow, whose printed fix (force_eager) must work (Note [force_eager never lowers])."""

from __future__ import annotations

import pytest
import torch

import graphex
from conftest import assert_same, compile_graphex, engine_runs

pytestmark = pytest.mark.default_isa  # run again under ATEN_CPU_CAPABILITY=default (make test-default-isa)


@pytest.fixture(autouse=True)
def no_grad():
    with torch.no_grad():
        yield


def _spd(n: int = 4) -> torch.Tensor:
    a = torch.randn(n, n, generator=torch.Generator().manual_seed(n))
    return a @ a.T + n * torch.eye(n)


LINALG = {
    "linalg.inv": lambda a, b: torch.linalg.inv(a),
    "Tensor.inverse": lambda a, b: a.inverse(),
    "linalg.solve": lambda a, b: torch.linalg.solve(a, b),
    "linalg.cholesky": lambda a, b: torch.linalg.cholesky(a),
    "linalg.lu_factor": lambda a, b: torch.linalg.lu_factor(a),
    "linalg.ldl_factor": lambda a, b: torch.linalg.ldl_factor(a),
    "linalg.tensorinv": lambda a, b: torch.linalg.tensorinv(a.reshape(4, 2, 2), ind=1),
    "linalg.tensorsolve": lambda a, b: torch.linalg.tensorsolve(a, b),
}


@pytest.mark.parametrize("name", sorted(LINALG))
def test_linalg_ops_with_effect_tokens_run_on_the_engine_bitwise(name):
    f = LINALG[name]
    a, b = _spd(), torch.randn(4)
    compiled = compile_graphex(lambda a, b: f(a, b))
    before = engine_runs()
    assert_same(compiled(a, b), f(a, b))
    assert_same(compiled(a * 2, b), f(a * 2, b))
    assert engine_runs() == before + 2


def test_a_singular_matrix_raises_what_eager_raises():
    compiled = compile_graphex(lambda a: torch.linalg.inv(a) + 1)
    compiled(_spd())
    singular = torch.zeros(4, 4)
    with pytest.raises(torch.linalg.LinAlgError) as eager:
        torch.linalg.inv(singular)
    try:
        torch.compile(lambda a: torch.linalg.inv(a) + 1, backend="aot_eager", fullgraph=True)(singular)
    except torch.linalg.LinAlgError:
        pass
    else:  # torch <= 2.12: AOTAutograd drops the unused _linalg_check_errors (no effect token yet)
        pytest.skip(f"torch {torch.__version__}: aot_eager returns NaN for a singular matrix too (the check is dropped)")
    with pytest.raises(torch.linalg.LinAlgError) as replay:
        compiled(singular)
    assert isinstance(replay.value, graphex.ReplayError)
    assert str(eager.value).strip().splitlines()[0] in str(replay.value)


SCATTERS = {
    "diagonal_scatter": lambda x, s: torch.diagonal_scatter(x, s),
    "as_strided_scatter": lambda x, s: torch.as_strided_scatter(x, s, (3,), (4,)),
    "copy into a view of a clone": lambda x, s: _diag_copy(x.clone(), s),
}


def _diag_copy(y: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    y.diagonal().copy_(s)
    return y


@pytest.mark.parametrize("options", [{}, {"inplace_pass": False, "input_inplace_pass": False, "remove_noop_ops": False},
                                     {"force_eager": True}], ids=["default", "passes-off", "force_eager"])
@pytest.mark.parametrize("name", sorted(SCATTERS))
def test_scatters_whose_decomposition_calls_an_operator_packet(name, options):
    f = SCATTERS[name]
    x, s = torch.randn(3, 3), torch.randn(3)
    compiled = compile_graphex(f, **options)
    before = engine_runs()
    assert_same(compiled(x, s), f(x, s))
    assert engine_runs() == before + (0 if options.get("force_eager") else 1)


def test_control_flow_error_advises_force_eager_and_that_works():
    def f(x):
        return torch.cond(x.sum() > 0, lambda x: x.sin(), lambda x: x.cos(), (x,))

    x = torch.randn(5)
    with pytest.raises(graphex.CaptureError) as info:
        compile_graphex(f)(x)
    assert "options={'force_eager': True}" in info.value.finding.fix
    assert info.value.finding.node and "in f" in info.value.finding.where
    torch._dynamo.reset()
    compiled = compile_graphex(f, force_eager=True)  # the fix, applied
    assert_same(compiled(x), f(x))
    assert_same(compiled(-x.abs()), f(-x.abs()))


@pytest.mark.default_isa
@pytest.mark.parametrize("dynamic", [False, True])
@pytest.mark.parametrize("start", [1, -3])
def test_narrow_with_a_tensor_start_replays_its_sym_ite(dynamic, start):
    """narrow(x, dim, start: Tensor, length) reads start on the host and picks `start + size` for a negative one
    with torch.sym_ite: the engine evaluates it (the OpInfo matrix's only graphex-only error, 8 cases)."""
    def f(x, s):
        return torch.narrow(x, 1, s, 2) * 2

    compiled = torch.compile(f, backend="graphex", fullgraph=True, dynamic=dynamic)
    x = torch.randn(3, 5)
    before = engine_runs()
    for s in (start, start + 1):
        assert_same(compiled(x, torch.tensor(s)), f(x, torch.tensor(s)))
    assert engine_runs() > before, "the engine did not run the graph"
