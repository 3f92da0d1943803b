"""Note [Inference first]: with autograd needed, the forward runs on the engine and gradients match eager."""

from __future__ import annotations

import warnings

import torch

from conftest import assert_same, compile_graphex, engine_runs


def test_training_runs_the_forward_on_the_engine_with_correct_gradients():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    reference = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    reference.load_state_dict(model.state_dict())
    compiled = compile_graphex(model)
    x = torch.randn(4, 6)
    before = engine_runs()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        outs = [compiled(x) for _ in range(3)]
        for out in outs:
            out.sum().backward()
    expected = reference(x)
    for _ in range(3):
        reference(x).sum().backward()
    for out in outs:  # the forward is eager's kernels, replayed by the engine: bit for bit
        assert out.requires_grad and torch.equal(out, expected)
    for p, q in zip(model.parameters(), reference.parameters()):
        assert torch.allclose(p.grad, q.grad, rtol=0, atol=1e-6)
    assert engine_runs() == before + 3  # each forward ran on the engine, not on a fallback
    assert [str(w.message) for w in caught if "graphex" in str(w.message)] == []


def test_input_requiring_grad_gets_its_gradient_through_the_engine_forward():
    x = torch.randn(5, requires_grad=True)
    f = lambda x: (torch.sin(x) * x).sum()  # noqa: E731
    compiled = compile_graphex(f)
    before = engine_runs()
    out = compiled(x)
    (grad,) = torch.autograd.grad(out, x)
    x2 = x.detach().clone().requires_grad_(True)
    (expected,) = torch.autograd.grad(f(x2), x2)
    assert torch.equal(out.detach(), f(x.detach()))
    assert torch.allclose(grad, expected, rtol=0, atol=1e-6)
    assert engine_runs() == before + 1


def test_same_model_under_no_grad_uses_the_engine():
    model = torch.nn.Linear(6, 2)
    x = torch.randn(3, 6)
    compiled = compile_graphex(model)
    before = engine_runs()
    with torch.no_grad():
        assert_same(compiled(x), model(x))
    assert engine_runs() == before + 1
