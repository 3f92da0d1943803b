"""torch's guard filters with graphex (docs/exact-mode.md, "Guard filters: what is safe to drop"): what each filter
keeps, and what graphex's engine still checks on every call when Dynamo's guards are dropped."""

from __future__ import annotations

import pytest
import torch

from graphex.errors import SignatureError

FILTERS = ["skip_guard_on_all_nn_modules_unsafe", "keep_tensor_guards_unsafe", "skip_all_guards_unsafe"]


@pytest.fixture(autouse=True)
def no_grad():
    torch._dynamo.reset()
    with torch.no_grad():
        yield
    torch._dynamo.reset()


def _block() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 8)).eval()


def _compiled(model: torch.nn.Module, guard_filter: str):
    return torch.compile(model, backend="graphex", fullgraph=True, dynamic=False,
                         options={"guard_filter_fn": getattr(torch.compiler, guard_filter)})


@pytest.mark.parametrize("guard_filter", FILTERS)
def test_the_same_calls_are_bitwise_eager(guard_filter):
    model = _block()
    compiled = _compiled(model, guard_filter)
    for _ in range(3):
        x = torch.randn(4, 8)
        assert torch.equal(compiled(x), model(x))


@pytest.mark.parametrize("guard_filter", FILTERS)
def test_a_replaced_parameter_of_the_same_shape_is_still_read(guard_filter):
    """Dynamo loads parameters from the module on every call: dropping their guards does not freeze them."""
    model = _block()
    compiled = _compiled(model, guard_filter)
    x = torch.randn(4, 8)
    compiled(x)
    model[0].weight = torch.nn.Parameter(torch.randn(16, 8))
    assert torch.equal(compiled(x), model(x))


def test_without_guards_another_shape_is_refused_by_the_engine_not_run_wrong():
    model = _block()
    compiled = _compiled(model, "skip_all_guards_unsafe")
    compiled(torch.randn(4, 8))
    with pytest.raises(SignatureError, match=r"args\[0\].*expected float32\[4, 8\].*got float32\[5, 8\]") as info:
        compiled(torch.randn(5, 8))
    assert "guard_filter_fn" in str(info.value)  # the message says why torch.compile did not compile again
    model.double()  # every parameter of another dtype: refused too, naming the first
    with pytest.raises(SignatureError, match=r"weight.*expected float32\[16, 8\].*got float64\[16, 8\]"):
        compiled(torch.randn(4, 8, dtype=torch.float64))


def test_with_tensor_guards_another_shape_compiles_again():
    model = _block()
    compiled = _compiled(model, "keep_tensor_guards_unsafe")
    compiled(torch.randn(4, 8))
    x = torch.randn(5, 8)
    assert torch.equal(compiled(x), model(x))


def _write_one_read_the_other(a, b):
    r = b.sum()
    a.zero_()
    return r + b.sum()


def test_without_guards_one_tensor_passed_twice_is_refused_by_the_engine_not_run_wrong():
    """Note [A program's tensor inputs are separate tensors]: with every guard dropped, `f(x, x)` reached the graph
    captured for `f(a, b)` and gave 32 where eager, reading its own write, gives 16; the engine now refuses it,
    naming both inputs."""
    torch._dynamo.reset()
    compiled = torch.compile(_write_one_read_the_other, backend="graphex", fullgraph=True, dynamic=False,
                             options={"guard_filter_fn": torch.compiler.skip_all_guards_unsafe})
    with torch.no_grad():
        assert compiled(torch.ones(4, 4), torch.ones(4, 4)).item() == 32.0  # two tensors: eager's 32
        x = torch.ones(4, 4)
        with pytest.raises(SignatureError, match=r"inputs 0 \('.*'\) and 1 \('.*'\) are the same tensor"):
            compiled(x, x)
    assert torch.equal(x, torch.ones(4, 4))  # refused before anything ran
