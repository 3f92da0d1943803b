"""Errors name the op or input at fault, the user's source line, and the fix."""

from __future__ import annotations

import pytest
import torch

import graphex
from conftest import compile_graphex

HERE = __file__.rsplit("/", 1)[-1]


@pytest.fixture(autouse=True)
def no_grad():
    with torch.no_grad():
        yield


def test_data_dependent_branch_names_the_line_and_the_fix():
    def f(x):
        if x.sum().item() > 0:  # data-dependent: cannot be one static graph
            return x + 1
        return x - 1

    with pytest.raises(Exception) as info:
        compile_graphex(f)(torch.randn(4))
    message = str(info.value)
    assert f"{HERE}" in message and "if x.sum().item() > 0" in message
    assert "torch._check" in message or "torch.cond" in message


def test_control_flow_op_is_a_capture_error_with_line_and_fix():
    def f(x):
        return torch.cond(x.sum() > 0, lambda t: t + 1, lambda t: t - 1, (x,))

    with pytest.raises(graphex.CaptureError) as info:
        compile_graphex(f)(torch.randn(4))
    message = str(info.value)
    assert "cond" in message
    assert f"{HERE}:" in message and "torch.cond(" in message
    assert "fix:" in message and "force_eager" in message


def test_operator_without_a_kernel_for_the_device_is_named():
    lib = torch.library.Library("graphex_test_nokernel", "FRAGMENT")
    lib.define("double(Tensor x) -> Tensor")
    lib.impl("double", lambda x: torch.empty_like(x), "Meta")

    def f(x):
        return torch.ops.graphex_test_nokernel.double(x) + 1

    with pytest.raises(graphex.CaptureError) as info:
        compile_graphex(f)(torch.randn(3))
    message = str(info.value)
    assert "graphex_test_nokernel::double" in message and "no kernel for CPU" in message
    assert f"{HERE}:" in message and "register" in message


def test_failing_operator_at_replay_names_node_and_line():
    def f(x, idx):
        return x.index_select(0, idx) * 2

    compiled = compile_graphex(f)
    x = torch.randn(4)
    compiled(x, torch.tensor([0, 3]))
    with pytest.raises(graphex.ReplayError) as info:
        compiled(x, torch.tensor([0, 9]))  # out of range: the kernel itself fails
    message = str(info.value)
    assert "aten::index_select" in message
    assert f"{HERE}:" in message and "x.index_select(0, idx)" in message
    assert "out of range" in message or "index" in message.lower()
