"""frozen_parameter: parameters are constants of the program, and replacing one is never silently ignored.

Note [A frozen parameter is checked by identity] (csrc/runtime/executor.h): every run compares each
frozen input with the tensor baked in; a replaced parameter or buffer re-lowers the program.
"""

from __future__ import annotations

import warnings

import pytest
import torch

import graphex
from conftest import assert_same, captures, compile_graphex, engine_runs


@pytest.fixture(autouse=True)
def no_grad():
    with torch.no_grad():
        yield


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(4, 4)
        self.fc2 = torch.nn.Linear(4, 2)
        self.register_buffer("shift", torch.full((2,), 0.5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x))) + self.shift


def _compiled(model: torch.nn.Module):
    compiled = compile_graphex(model, frozen_parameter=True)
    return compiled


def test_replacing_a_parameter_object_relowers_and_matches_eager(monkeypatch, capfd):
    monkeypatch.setenv("GRAPHEX_LOG", "1")
    torch.manual_seed(0)
    model, x = Net().eval(), torch.randn(3, 4)
    compiled = _compiled(model)
    assert_same(compiled(x), model(x))
    graph = captures()[-1]
    assert graph.lowered.frozen_inputs and graph.relowerings == 0

    model.fc1.weight = torch.nn.Parameter(torch.randn(4, 4))  # a new object: the old program would be stale
    before = engine_runs()
    assert_same(compiled(x), model(x))
    assert engine_runs() > before, "the re-lowered program runs on the engine"
    assert graph.relowerings == 1
    err = capfd.readouterr().err
    assert "was replaced after compiling" in err and "fc1" in err, err
    assert_same(compiled(x), model(x))  # the new program is kept: no re-lowering per call
    assert graph.relowerings == 1


def test_replacing_a_buffer_relowers():
    torch.manual_seed(1)
    model, x = Net().eval(), torch.randn(3, 4)
    compiled = _compiled(model)
    assert_same(compiled(x), model(x))
    model.shift = torch.full((2,), -3.0)
    assert_same(compiled(x), model(x))
    assert captures()[-1].relowerings == 1


def test_in_place_updates_and_data_assignment_are_seen_without_relowering():
    torch.manual_seed(2)
    model, x = Net().eval(), torch.randn(3, 4)
    compiled = _compiled(model)
    assert_same(compiled(x), model(x))
    model.fc2.weight.mul_(3)  # same tensor, new values
    assert_same(compiled(x), model(x))
    model.fc1.bias.data = torch.randn(4)  # same TensorImpl, new storage
    assert_same(compiled(x), model(x))
    model.fc1.weight.copy_(torch.randn(4, 4))
    assert_same(compiled(x), model(x))
    assert captures()[-1].relowerings == 0


def test_repeated_replacement_warns_once_with_the_fix():
    torch.manual_seed(3)
    model, x = Net().eval(), torch.randn(3, 4)
    compiled = _compiled(model)
    compiled(x)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(5):
            model.fc2.weight = torch.nn.Parameter(torch.randn(2, 4))
            assert_same(compiled(x), model(x))
    messages = [str(w.message) for w in caught if "frozen parameters were replaced" in str(w.message)]
    assert len(messages) == 1, messages
    assert "frozen_parameter" in messages[0] and "copy_" in messages[0]
    assert captures()[-1].relowerings == 5


def test_the_applied_fix_in_place_copy_needs_no_relowering():
    # The warning's fix, applied: param.copy_(new) keeps the program.
    torch.manual_seed(4)
    model, x = Net().eval(), torch.randn(3, 4)
    compiled = _compiled(model)
    compiled(x)
    for _ in range(5):
        model.fc2.weight.copy_(torch.randn(2, 4))
        assert_same(compiled(x), model(x))
    assert captures()[-1].relowerings == 0


def test_a_bare_executor_refuses_a_replaced_parameter_by_name():
    torch.manual_seed(5)
    model, x = Net().eval(), torch.randn(3, 4)
    compiled = _compiled(model)
    compiled(x)
    graph = captures()[-1]
    args: list = []
    stop = graph.watch(lambda a, _outs: args.append(list(a)))
    compiled(x)
    stop()
    flat = args[0]
    index = graph.lowered.frozen_inputs[0]
    assert graph.executor.fits(flat)
    flat[index] = flat[index].clone()  # equal values, another tensor
    assert not graph.executor.fits(flat)
    with pytest.raises(graphex.FrozenInputReplaced, match="frozen parameter") as info:
        graph.executor(flat)
    assert info.value.input == index
    assert isinstance(info.value, graphex.SignatureError)
