"""Note [Max pooling without its indices] and Note [Max pooling picks eager's element]: in fused mode, a max pooling
whose indices nothing reads runs graphex_fused::max_pool2d, bit for bit eager's values (NaNs, signed zeros and
-inf included), under every ATEN_CPU_CAPABILITY; what reads the indices, other layouts and dtypes keep eager's."""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.nn.functional as F

import graphex  # noqa: F401
import graphex._C  # noqa: F401

from conftest import newest_capture

FUSED = {"pattern_fusion_pass": True}


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view({torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float16: torch.int16}[t.dtype])


def _same_bits(got: torch.Tensor, want: torch.Tensor) -> bool:
    # bit for bit, a NaN only for a NaN (its payload may be another NaN's: eager's is whichever it kept)
    if got.shape != want.shape or got.dtype != want.dtype:
        return False
    nan = torch.isnan(want)
    return bool((torch.isnan(got) == nan).all()) and torch.equal(_bits(got)[~nan], _bits(want)[~nan])


def _special(shape, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g)
    flat = x.view(-1)
    picks = torch.randint(0, flat.numel(), (max(1, flat.numel() // 7),), generator=g)
    specials = torch.tensor([float("nan"), float("inf"), -float("inf"), 0.0, -0.0])
    flat[picks] = specials[torch.randint(0, 5, picks.shape, generator=g)]
    return x.to(dtype)


CONFIGS = [  # (input shape, kernel, stride, padding, dilation, ceil_mode)
    ((1, 32, 64, 64), [2, 2], [2, 2], [0, 0], [1, 1], False),  # a ResNet stem's pool
    ((2, 8, 57, 61), [3, 3], [2, 2], [1, 1], [1, 1], False),  # ResNet-50's, odd sizes
    ((2, 8, 57, 61), [3, 3], [2, 2], [1, 1], [1, 1], True),
    ((3, 40, 33), [3, 2], [1, 2], [1, 0], [1, 1], False),  # a 3-d input, uneven kernel
    ((1, 4, 70, 90), [2, 3], [3, 1], [1, 1], [2, 3], True),  # dilation, stride 1 along the width
    ((1, 2, 5, 5), [5, 5], [1, 1], [2, 2], [1, 1], False),  # windows clipped on every side
    ((1, 3, 1, 40), [1, 4], [1, 4], [0, 2], [1, 1], True),
]


@pytest.mark.default_isa
@pytest.mark.parametrize("dtype", (torch.float32, torch.bfloat16, torch.float16), ids=str)
@pytest.mark.parametrize("config", CONFIGS, ids=[f"{c[0]}k{c[1]}s{c[2]}p{c[3]}d{c[4]}{'c' if c[5] else ''}"
                                                 for c in CONFIGS])
def test_the_kernel_is_eagers_bit_for_bit(config, dtype):
    shape, k, s, p, d, ceil = config
    for seed, special in itertools.product(range(2), (False, True)):
        x = _special(shape, dtype, seed) if special else torch.randn(shape).to(dtype)
        got = torch.ops.graphex_fused.max_pool2d(x, k, s, p, d, ceil)
        want = torch.ops.aten.max_pool2d_with_indices(x, k, s, p, d, ceil)[0]
        assert _same_bits(got, want), f"seed {seed} special {special}"


def test_all_minus_infinity_and_all_nan_windows():
    x = torch.full((1, 1, 4, 4), -float("inf"))
    x[0, 0, 2:, 2:] = float("nan")
    got = torch.ops.graphex_fused.max_pool2d(x, [2, 2], [2, 2], [0, 0], [1, 1], False)
    assert _same_bits(got, F.max_pool2d(x, 2))


def test_eagers_argument_errors():
    x = torch.randn(1, 1, 8, 8)
    with pytest.raises(RuntimeError, match="pad should be at most half"):
        torch.ops.graphex_fused.max_pool2d(x, [2, 2], [2, 2], [2, 2], [1, 1], False)
    with pytest.raises(RuntimeError):
        F.max_pool2d(x, 2, 2, 2)


class _Stem(torch.nn.Module):
    def __init__(self, **pool):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.pool = torch.nn.MaxPool2d(**pool)

    def forward(self, x):
        out = self.pool(torch.relu(self.conv(x)))
        return out[0] + out[1].float() if isinstance(out, tuple) else out


def _fired(fn, *args, **options):
    torch._dynamo.reset()
    with torch.no_grad():
        got = torch.compile(fn, backend="graphex", fullgraph=True, dynamic=False, options={**FUSED, **options})(*args)
    return got, newest_capture().fused


@pytest.mark.parametrize("dtype", (torch.float32, torch.bfloat16), ids=str)
def test_a_model_pools_without_indices_bit_for_bit(dtype):
    torch.manual_seed(0)
    stem = _Stem(kernel_size=3, stride=2, padding=1).to(dtype).eval()
    x = torch.randn(2, 3, 31, 30).to(dtype)
    got, fired = _fired(lambda t: stem.pool(t), x)
    assert fired.get("max_pool2d") == 1
    assert _same_bits(got, stem.pool(x))
    # the conv's output in its contiguous order (channels_last would hand the pool another layout, and its kernel
    # declines that: Note [A conv net runs channels_last between its convolutions])
    got, fired = _fired(stem, x, pointwise_fusion=False, channels_last_conv=False)
    assert fired.get("max_pool2d") == 1
    with torch.no_grad():
        assert torch.equal(got, stem(x))  # conv, relu and the pool: eager's kernels and ours, bit for bit


def test_what_reads_the_indices_or_another_layout_keeps_eagers_kernel():
    torch.manual_seed(0)
    x = torch.randn(1, 3, 16, 16)
    stem = _Stem(kernel_size=2, return_indices=True).eval()
    got, fired = _fired(stem, x, channels_last_conv=False)
    assert "max_pool2d" not in fired
    with torch.no_grad():
        assert torch.equal(got, stem(x))
    pool = torch.nn.MaxPool2d(2)
    got, fired = _fired(pool, x.to(memory_format=torch.channels_last))
    assert "max_pool2d" not in fired
    got, fired = _fired(pool, x.double())
    assert "max_pool2d" not in fired and torch.equal(got, pool(x.double()))


def test_a_channels_last_input_of_one_channel_keeps_eagers_layout():
    """[2, 1, 8, 8] in channels_last is also contiguous, but eager's result is channels_last (its size-1 channel
    dimension strided 1, not 16): the kernel writes row-major memory, so the pool keeps eager's kernel there and the
    strides are eager's (found by a helper). The same shape in row-major memory still fuses."""
    pool = torch.nn.MaxPool2d(2)
    x = torch.randn(2, 1, 8, 8)
    for inp, fuses in ((x.to(memory_format=torch.channels_last), False), (x, True)):
        torch._dynamo.reset()
        got, fired = _fired(pool, inp)
        want = pool(inp)
        assert ("max_pool2d" in fired) == fuses
        assert torch.equal(got, want) and got.stride() == want.stride(), (got.stride(), want.stride())


def test_the_log_counts_every_fused_kernel_and_says_why_a_pool_was_declined(capsys, monkeypatch):
    """GRAPHEX_LOG=1 names the kernels fused mode's rules fired after the patterns (a helper found max pooling logged
    as "no pattern matched"), and GRAPHEX_LOG=2 says why a pool keeps eager's kernel."""
    monkeypatch.setenv("GRAPHEX_LOG", "2")
    pool = torch.nn.MaxPool2d(2)
    for x, want in ((torch.randn(1, 4, 6, 6), "fused mode: max_pool2d x1"),
                    (torch.randn(1, 4, 6, 6).contiguous(memory_format=torch.channels_last), "fused mode: nothing fused")):
        torch._dynamo.reset()
        compiled = torch.compile(pool, backend="graphex", fullgraph=True, dynamic=False, options=FUSED)
        with torch.no_grad():
            assert torch.equal(compiled(x), pool(x))
        err = capsys.readouterr().err
        assert f"{newest_capture().name}: {want}" in err, err
    assert "keeps eager's kernel: its input is not a contiguous" in err, err
