"""Note [CSE keeps eager's values]: repeated pure ATen calls run once; nothing else is merged."""

from __future__ import annotations

import pytest
import torch

from conftest import assert_same, compile_graphex, newest_capture

pytestmark = pytest.mark.default_isa  # run again under ATEN_CPU_CAPABILITY=default (make test-default-isa)


def _targets() -> list[str]:
    return [t for _, t in newest_capture().executor.node_names()]


def test_a_mask_recomputed_per_layer_runs_once_and_stays_bitwise():
    def f(x, mask):
        for _ in range(4):
            x = x.masked_fill(~mask, 0.0) * 1.5  # `~mask` in every layer, as the shipped decoder does
        return x

    torch.manual_seed(0)
    x, mask = torch.randn(4, 8), torch.rand(4, 8) > 0.5
    with torch.no_grad():
        assert_same(compile_graphex(f)(x, mask), f(x, mask))
        assert _targets().count("aten::bitwise_not.default") == 1
        assert_same(compile_graphex(f, cse=False)(x, mask), f(x, mask))
        assert _targets().count("aten::bitwise_not.default") == 4


def test_random_ops_are_not_merged():
    def f(x):
        return torch.rand_like(x) - torch.rand_like(x)

    x = torch.zeros(64)
    torch.manual_seed(1)
    expected = f(x)
    compiled = compile_graphex(f)
    torch.manual_seed(1)
    out = compiled(x)
    assert_same(out, expected)
    assert out.abs().sum() > 0


def test_equal_outputs_stay_distinct_tensors():
    def f(x):
        return x + 1, x + 1

    x = torch.randn(5)
    a, b = compile_graphex(f)(x)
    assert_same([a, b], list(f(x)))
    assert a.data_ptr() != b.data_ptr()
    a.add_(10)  # the caller may write one output: the other is unchanged, as in eager
    assert_same(b, x + 1)


def test_a_split_written_twice_runs_once_and_its_returned_parts_stay_two_tensors():
    """split.Tensor (what chunk writes) and its getitems are views: repeated, they run once, bitwise; a part returned
    twice is two tensors, as in eager (reshaping one leaves the other)."""
    def f(x):
        y = x * 2
        return torch.cat((-y.chunk(2, -1)[1], y.chunk(2, -1)[0]), -1) + 1

    def returned(x):
        y = x * 2
        return y.chunk(2, -1)[0], y.chunk(2, -1)[0]

    x = torch.randn(3, 8)
    with torch.no_grad():
        assert_same(compile_graphex(f)(x), f(x))
        assert _targets().count("aten::split.Tensor") == 1
        assert_same(compile_graphex(f, cse=False)(x), f(x))
        assert _targets().count("aten::split.Tensor") == 2
        a, b = compile_graphex(returned)(x)
    assert_same([a, b], list(returned(x)))
    assert a is not b
    a.t_()
    assert b.shape == (3, 4)


calls = {"n": 0}


@torch.library.custom_op("gx_cse::noisy", mutates_args=())
def noisy(x: torch.Tensor) -> torch.Tensor:
    calls["n"] += 1
    return x * 2


@noisy.register_fake
def _(x):
    return torch.empty_like(x)


def test_custom_ops_are_never_merged():
    def f(x):
        return noisy(x) + noisy(x)

    x = torch.randn(3)
    compiled = compile_graphex(f)
    compiled(x)
    before = calls["n"]
    assert_same(compiled(x), f(x))
    assert calls["n"] - before == 4  # two in the replay, two in eager
    assert _targets().count("gx_cse::noisy.default") == 2


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64], ids=str)
def test_a_number_and_its_negative_zero_are_not_merged(dtype):
    """0.0 == -0.0 and both hash alike: keyed by value, `a / 0.0` and `a / -0.0` were one node and the second result
    was the first's (+inf for -inf), in exact and fused mode (found by a helper trying to break fused mode). Numbers
    are keyed by their bits."""
    def f(a):
        return ((a / 0.0) * 1, (a / -0.0) * 1, (0.0 - a) * 1, (-0.0 - a) * 1,
                1 / torch.full_like(a, 0.0) + a, 1 / torch.full_like(a, -0.0) + a, a * float("nan"), a * float("nan"))

    def bits(t):  # the sign of every zero and infinity counts; a NaN is a NaN
        t = torch.where(t.isnan(), torch.full_like(t, float("nan")), t)
        return t.view({8: torch.int64, 4: torch.int32, 2: torch.int16}[t.element_size()])

    a = torch.tensor([1.0, -2.0, 0.0, -0.0] * 8).to(dtype)
    for options in ({}, {"pattern_fusion_pass": True}):
        torch._dynamo.reset()
        for i, (got, want) in enumerate(zip(compile_graphex(f, **options)(a), f(a))):
            assert got.dtype == want.dtype and torch.equal(bits(got), bits(want)), (options, i, got[:4], want[:4])
