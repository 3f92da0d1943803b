"""Note [Inference first]: with autograd needed, results and gradients still match eager."""

from __future__ import annotations

import warnings

import torch

from conftest import assert_same, compile_graphex, engine_runs


def test_training_falls_back_with_one_message_and_correct_gradients():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    reference = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    reference.load_state_dict(model.state_dict())
    compiled = compile_graphex(model)
    x = torch.randn(4, 6)
    before = engine_runs()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            compiled(x).sum().backward()
    reference(x).sum().backward()
    reference(x).sum().backward()
    reference(x).sum().backward()
    for p, q in zip(model.parameters(), reference.parameters()):
        assert torch.allclose(p.grad, q.grad, rtol=0, atol=1e-6)
    messages = [str(w.message) for w in caught if "needs autograd" in str(w.message)]
    assert len(messages) == 1, messages
    assert "torch.no_grad()" in messages[0]
    assert engine_runs() == before  # the engine is for inference graphs only


def test_same_model_under_no_grad_uses_the_engine():
    model = torch.nn.Linear(6, 2)
    x = torch.randn(3, 6)
    compiled = compile_graphex(model)
    before = engine_runs()
    with torch.no_grad():
        assert_same(compiled(x), model(x))
    assert engine_runs() == before + 1
