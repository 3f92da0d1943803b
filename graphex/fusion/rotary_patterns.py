"""The built-in rotary patterns of fused mode (patterns.py registers them in its common group, at this place in its
order): rotate_half by chunk or slices, interleaved pairs (GPT-J's rotate_every_two, the pairs stacked) and Meta's
complex product with freqs_cis, each replaced by graphex_fused::rotary (csrc/fused/rotary.cpp)."""

from __future__ import annotations

from typing import Callable

import torch
from torch._inductor.pattern_matcher import Match

from .. import _C  # noqa: F401  (registers the graphex_fused:: kernels used below)

from .checks import all_of, float_cpu, val
from .registration import register_named

fused = torch.ops.graphex_fused


# ---- Rotary embedding -----------------------------------------------------------------------------

def rotary(x, cos, sin):  # examples/models/decoder.py: rotate_half by chunk
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


def rotary_slices(x, cos, sin):  # transformers' rotate_half: two slices
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2 :]
    return (x * cos) + (torch.cat((-x2, x1), dim=-1) * sin)


def rotary_fused(x, cos, sin):
    return fused.rotary(x, cos, sin)


def _rotary_shapes(match: Match) -> bool:
    x, cos, sin = val(match, "x"), val(match, "cos"), val(match, "sin")
    if x.dim() < 1 or x.shape[-1] % 2 or cos.shape[-1] != x.shape[-1] or sin.shape[-1] != x.shape[-1]:
        return False
    return tuple(torch.broadcast_shapes(x.shape, cos.shape, sin.shape)) == tuple(x.shape)


# Interleaved pairs: (x[2i], x[2i + 1]) rotated together (GPT-J, GLM, the pairs written out), one kernel for both
# spellings (Note in csrc/fused/rotary.cpp): its float32 result is eager's bit for bit.

def _rotate_every_two(x):  # transformers' GPT-J: stack((-x2, x1), -1).flatten(-2) of the odd and even elements
    x1 = x[..., ::2]
    x2 = x[..., 1::2]
    return torch.stack((-x2, x1), dim=-1).flatten(-2)


def rotary_every_two(x, cos, sin):  # GPT-J's apply_rotary_pos_emb: cos and sin duplicated per pair (x's width)
    return (x * cos) + (_rotate_every_two(x) * sin)


def rotary_pairs(x, cos, sin):  # the pairs written out, cos and sin one entry per pair (half of x's width)
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2)


def rotary_pairs_swapped(x, cos, sin):  # the same with the second sum's terms the other way round
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.stack((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).flatten(-2)


def rotary_interleaved_fused(x, cos, sin):
    return fused.rotary(x, cos, sin, True)


# Meta's reference Llama (`apply_rotary_emb`): the pairs as complex numbers times a complex table `freqs_cis`
# (e^{i theta} per pair), the same rotation as the pairs written out: (a + ib)(c + id) = (ac - bd) + i(ad + bc).
# In a bfloat16/float16 model the code upcasts first (`xq.float()`), so the float32 form below matches there too,
# between eager's casts. Not bit for bit: eager's complex product is compiled per CPU capability, and its AVX2 /
# AVX-512 builds fuse one of the two products (an FMA, the kernel rounds both: a last-bit difference, and where one
# product alone overflows float32, which needs |freqs| far from 1, eager there gives a finite value or -inf where
# the kernel, like eager's baseline build, gives inf or NaN; found by a helper).

def _rotary_complex(sizes_given: bool, freqs_first: bool) -> Callable[..., torch.Tensor]:
    """Meta's form with the pairs' view written `(..., -1, 2)` (its code) or with its sizes: torch's matcher re-traces
    a search function on each match's shapes and compares the view's list, which holds a -1 in one spelling only."""
    def search(x, freqs):
        pairs = torch.view_as_complex(x.reshape(*x.shape[:-1], x.shape[-1] // 2 if sizes_given else -1, 2))
        return torch.view_as_real(freqs * pairs if freqs_first else pairs * freqs).flatten(3)

    search.__qualname__ = search.__name__ = "rotary_complex" + ("_sizes" if sizes_given else "") + (
        "_freqs_first" if freqs_first else "")
    return search


def rotary_complex_fused(x, freqs):
    table = torch.view_as_real(freqs)  # [..., D/2, 2]: cos and sin per pair
    return fused.rotary(x.contiguous(), table[..., 0], table[..., 1], True)


def _rotary_complex_shapes(match: Match) -> bool:
    """The complex form's case: x float32 and freqs complex64 on the CPU (static shapes), x's pairs its last
    dimension's neighbours (the view before view_as_complex is x's shape with the last dimension split into
    [D/2, 2], and the view after it gives x's shape back: the matcher compares no shape), and freqs broadcasting
    to the pairs without growing them."""
    x, freqs = val(match, "x"), val(match, "freqs")
    if not isinstance(x, torch.Tensor) or not isinstance(freqs, torch.Tensor) or x.dtype != torch.float32 \
            or freqs.dtype != torch.complex64 or x.device.type != "cpu" or freqs.device.type != "cpu":
        return False
    if not all(type(d) is int for t in (x, freqs) for d in (*t.shape, *t.stride())):
        return False
    if x.dim() < 1 or x.shape[-1] % 2:
        return False
    pairs = (*x.shape[:-1], x.shape[-1] // 2)
    views = [n for n in match.nodes if n.target is torch.ops.aten.view.default]
    shapes = sorted(tuple(n.meta["val"].shape) for n in views if isinstance(n.meta.get("val"), torch.Tensor))
    if len(views) != 2 or shapes != sorted([(*pairs, 2), tuple(x.shape)]):
        return False
    try:
        return tuple(torch.broadcast_shapes(pairs, freqs.shape)) == pairs
    except RuntimeError:
        return False


def rotary_pairs_fused(x, cos, sin):  # eager's stack writes a fresh contiguous tensor: the kernel's follows x's layout
    return fused.rotary(x.contiguous(), cos, sin, True)


def _rotary_pairs_shapes(per_pair: bool) -> Callable[[Match], bool]:
    """Interleaved rotary's case: x's last dimension even; cos and sin of one shape with x's last dimension (GPT-J's
    tables, an entry per element) or half of it (`per_pair`), their leading dimensions broadcasting to x's without
    growing it."""
    def check(match: Match) -> bool:
        x, cos, sin = val(match, "x"), val(match, "cos"), val(match, "sin")
        if x.dim() < 1 or x.shape[-1] % 2 or cos.dim() < 1 or sin.dim() < 1:
            return False
        width = x.shape[-1] // 2 if per_pair else x.shape[-1]
        if cos.shape[-1] != width or sin.shape[-1] != width:
            return False
        try:
            lead = torch.broadcast_shapes(x.shape[:-1], cos.shape[:-1], sin.shape[:-1])
        except RuntimeError:
            return False
        return tuple(lead) == tuple(x.shape[:-1])

    return check


def register_rotary() -> None:
    t = torch.randn
    rot_ok = all_of(float_cpu("x", "cos", "sin"), _rotary_shapes)
    for search in (rotary, rotary_slices):
        register_named("rotary", search, rotary_fused, [t(1, 2, 3, 8), t(1, 1, 3, 8), t(1, 1, 3, 8)],
                       extra_check=rot_ok, builtin=True)
    register_named("rotary", rotary_every_two, rotary_interleaved_fused, [t(1, 3, 2, 8), t(1, 3, 1, 8), t(1, 3, 1, 8)],
                   extra_check=all_of(float_cpu("x", "cos", "sin"), _rotary_pairs_shapes(False)), builtin=True)
    for search in (_rotary_complex(sizes, first) for sizes in (False, True) for first in (False, True)):
        register_named("rotary", search, rotary_complex_fused,
                       [t(1, 3, 2, 8), torch.polar(torch.ones(1, 3, 1, 4), t(1, 3, 1, 4))],
                       extra_check=_rotary_complex_shapes, builtin=True)
    for search in (rotary_pairs, rotary_pairs_swapped):
        register_named("rotary", search, rotary_pairs_fused, [t(1, 2, 3, 8), t(1, 1, 3, 4), t(1, 1, 3, 4)],
                       extra_check=all_of(float_cpu("x", "cos", "sin"), _rotary_pairs_shapes(True)), builtin=True)
