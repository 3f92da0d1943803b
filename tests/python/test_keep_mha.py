"""Note [MultiheadAttention runs eager's fast path]: where eager runs the fused MHA kernel, graphex does too."""

from __future__ import annotations

import pytest
import torch

from conftest import assert_same, compile_graphex, newest_capture


def _targets() -> list[str]:
    return [t for _, t in newest_capture().executor.node_names()]


class Block(torch.nn.Module):
    def __init__(self, need_weights: bool, average: bool = True) -> None:
        super().__init__()
        self.attn = torch.nn.MultiheadAttention(64, 4, batch_first=True)
        self.norm = torch.nn.LayerNorm(64)
        self.need_weights, self.average = need_weights, average

    def forward(self, x):
        out, weights = self.attn(x, x, x, need_weights=self.need_weights, average_attn_weights=self.average)
        return (self.norm(x + out), weights) if self.need_weights else self.norm(x + out)


@pytest.mark.parametrize("need_weights,average", [(False, True), (True, True), (True, False)])
def test_self_attention_runs_the_fused_kernel_bit_for_bit(need_weights, average):
    torch.manual_seed(0)
    model = Block(need_weights, average).eval()
    x = torch.randn(3, 7, 64)
    with torch.no_grad():
        assert_same(compile_graphex(model)(x), model(x))
    assert _targets().count("aten::_native_multi_head_attention.default") == 1
    assert "aten::bmm.default" not in _targets() and "aten::mm.default" not in _targets()


def test_cases_eager_runs_slowly_stay_as_they_are():
    torch.manual_seed(1)
    mha = torch.nn.MultiheadAttention(64, 4, batch_first=True).eval()
    x, y = torch.randn(2, 5, 64), torch.randn(2, 6, 64)
    mask = torch.rand(2, 6) > 0.3

    def cross(x, y):  # not self-attention: eager's slow path unless query is key is value
        return mha(x, y, y, need_weights=False)[0]

    def masked(x, y):
        return mha(y, y, y, key_padding_mask=mask, need_weights=False)[0]

    with torch.no_grad():
        for f in (cross, masked):
            out = compile_graphex(f)(x, y)
            assert "aten::_native_multi_head_attention.default" not in _targets(), f.__name__
            assert torch.allclose(out, f(x, y), atol=1e-6), f.__name__


def test_training_mode_and_gradients_keep_the_slow_path():
    torch.manual_seed(2)
    model = Block(False).train()
    x = torch.randn(2, 5, 64, requires_grad=True)
    torch.manual_seed(3)
    out = compile_graphex(model)(x)
    out.sum().backward()
    assert x.grad is not None and x.grad.abs().sum() > 0
