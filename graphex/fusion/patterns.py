"""The built-in patterns of fused mode: what Llama-style decoders spend their CPU time on.

Each search function is written the way models write it (this repo's examples/models/decoder.py
and transformers' Llama modules); tracing it gives the ATen graph AOTAutograd makes of that code,
and the replacement calls a graphex_fused op (csrc/fused/). Every pattern's extra check admits
CPU tensors of one dtype, float32, bfloat16 or float16, so other dtypes keep eager's kernels (exact). Registered in priority
order: a pattern that contains another comes first (Note in manager.py).

    add_rms_norm   (x + residual, rms_norm(x + residual) * w)           2 forms (x*r*w, w*(x*r))
    rms_norm       x * rsqrt(mean(x^2, -1) + eps) * w                   2 forms, and Llama's float32 upcast in
                                                                        bfloat16 / float16 models; Gemma's
                                                                        factor (1 + w), with or without the add
    add_layer_norm (x + residual, layer_norm(x + residual, w, b))        with weight and bias, weight only, neither
    gated_mlp      down(silu(gate(x)) * up(x)) as three matmuls + one pass   3-d and 2-d x; GELU-gated (erf, tanh:
                                                                        eager's gelu and mul, in place)
                   one gate_up projection cut in two halves (Phi3; chunk or slices): gated_mlp_packed,
                   SiLU and both GELUs
    silu_mul       silu(gate) * up, or up * silu(gate) (a gated product outside a whole MLP)
    rotary         x * cos + rotate_half(x) * sin, interleaved pairs, Meta's complex form: rotary_patterns.py
    matvec         F.linear(x, w[, b]) on one row of x, float32 too (a decode step's projections)
    decode_attention  softmax(q k^T * s, masked) v for one query token: attention_patterns.py
    matvec         also x @ W and addmm(b, x, W) with W stored [K, N] (GPT-2's Conv1D)
"""

from __future__ import annotations

import functools
import itertools
import operator
import sys
from typing import Callable

import torch
import torch.nn.functional as F
from torch._inductor.pattern_matcher import Match

from .. import _C  # noqa: F401  (registers the graphex_fused:: kernels used below)

from .attention_patterns import register_attention
from .checks import all_of, fake_value, float_cpu, not_dtype, number, val
from .registration import register_named
from .rotary_patterns import register_rotary

fused = torch.ops.graphex_fused


# ---- RMSNorm and add + RMSNorm ------------------------------------------------------------------

def rms_norm(x, weight, eps):  # examples/models/decoder.py's RMSNorm
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def rms_norm_llama(x, weight, eps):  # transformers' LlamaRMSNorm on float32 (its .to()s are no-ops)
    return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def rms_norm_upcast(x, weight, eps):  # transformers' LlamaRMSNorm on bfloat16/float16: the norm in float32
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


def rms_norm_gemma(x, weight, eps):  # transformers' Gemma/Gemma2 RMSNorm on float32: the factor is (1 + w)
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * (1.0 + weight)


def rms_norm_fused(x, weight, eps):
    return fused.rms_norm(x, weight, eps)


def rms_norm_gemma_fused(x, weight, eps):
    return fused.rms_norm(x, weight, eps, 1.0)


def add_rms_norm(x, residual, weight, eps):
    h = x + residual
    return rms_norm(h, weight, eps), h


def add_rms_norm_llama(x, residual, weight, eps):
    h = x + residual
    return rms_norm_llama(h, weight, eps), h


def add_rms_norm_upcast(x, residual, weight, eps):
    h = x + residual
    return rms_norm_upcast(h, weight, eps), h


def add_rms_norm_gemma(x, residual, weight, eps):
    h = x + residual
    return rms_norm_gemma(h, weight, eps), h


def add_rms_norm_fused(x, residual, weight, eps):
    h, y = fused.add_rms_norm(x, residual, weight, eps)
    return y, h


def add_rms_norm_gemma_fused(x, residual, weight, eps):
    h, y = fused.add_rms_norm(x, residual, weight, eps, 1.0)
    return y, h


def _same_shape(a: str, b: str) -> Callable[[Match], bool]:
    return lambda match: tuple(val(match, a).shape) == tuple(val(match, b).shape)


def _row_weight(match: Match) -> bool:
    """The norm's weight is one row (what RMSNorm has): the kernel's output is then x's shape."""
    x, w = val(match, "x"), val(match, "weight")
    return w.dim() == 1 and x.dim() >= 1 and w.shape[0] == x.shape[-1]


# ---- add + LayerNorm ------------------------------------------------------------------------------
# The residual add and the LayerNorm after it (GPT-2, GPT-NeoX, Falcon, Bloom, BERT), the sum returned too: one pass
# (csrc/fused/layer_norm.cpp). A LayerNorm alone stays eager's native_layer_norm: one kernel already.

def add_layer_norm(x, residual, weight, bias, eps):
    h = x + residual
    return F.layer_norm(h, (h.shape[-1],), weight, bias, eps), h


def add_layer_norm_no_bias(x, residual, weight, eps):  # nn.LayerNorm(bias=False)
    h = x + residual
    return F.layer_norm(h, (h.shape[-1],), weight, None, eps), h


def add_layer_norm_no_affine(x, residual, eps):  # nn.LayerNorm(elementwise_affine=False)
    h = x + residual
    return F.layer_norm(h, (h.shape[-1],), None, None, eps), h


def add_layer_norm_fused(x, residual, weight, bias, eps):
    h, y = fused.add_layer_norm(x, residual, weight, bias, eps)
    return y, h


def add_layer_norm_no_bias_fused(x, residual, weight, eps):
    h, y = fused.add_layer_norm(x, residual, weight, None, eps)
    return y, h


def add_layer_norm_no_affine_fused(x, residual, eps):
    h, y = fused.add_layer_norm(x, residual, None, None, eps)
    return y, h


def _layer_norm_params(*names: str) -> Callable[[Match], bool]:
    """The norm's weight and bias are one row over x's last dimension (the kernel normalizes the last one only)."""
    def check(match: Match) -> bool:
        x = val(match, "x")
        return x.dim() >= 1 and all(val(match, n).dim() == 1 and val(match, n).shape[0] == x.shape[-1] for n in names)

    return check


# ---- SiLU-gated MLP -------------------------------------------------------------------------------

def gated_mlp(x, w_gate, w_up, w_down):
    return F.linear(F.silu(F.linear(x, w_gate)) * F.linear(x, w_up), w_down)


def gated_mlp_fused(x, w_gate, w_up, w_down):
    return fused.gated_mlp(x, w_gate, w_up, w_down)


def _gelu_gated_mlp(approximate: str, up_first: bool) -> Callable[..., torch.Tensor]:
    """down(gelu(gate(x)) * up(x)) (Gemma's tanh GELU, or the erf GELU), the product either way round."""
    if up_first:
        def search(x, w_gate, w_up, w_down):
            return F.linear(F.linear(x, w_up) * F.gelu(F.linear(x, w_gate), approximate=approximate), w_down)
    else:
        def search(x, w_gate, w_up, w_down):
            return F.linear(F.gelu(F.linear(x, w_gate), approximate=approximate) * F.linear(x, w_up), w_down)
    search.__qualname__ = search.__name__ = f"gelu{'_tanh' if approximate == 'tanh' else ''}_gated_mlp" + (
        "_up_first" if up_first else "")
    return search


def _gelu_gated_mlp_fused(approximate: str) -> Callable[..., torch.Tensor]:
    activation = "gelu_tanh" if approximate == "tanh" else "gelu"

    def replace(x, w_gate, w_up, w_down):
        return fused.gated_mlp(x, w_gate, w_up, w_down, activation)

    replace.__qualname__ = replace.__name__ = f"{activation}_gated_mlp_fused"
    return replace


def _chunk_halves(h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    # also split(I), split([I, I]), a positive dim (Note [Arguments are matched in one spelling])
    return h.chunk(2, dim=-1)


def _slice_halves(h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    half = h.shape[-1] // 2  # also narrow, tensor_split, h[..., I:2 * I] (the same Note)
    return h[..., :half], h[..., half:]


def _packed_gated_mlp(activation: str, up_first: bool, halves: Callable[..., tuple[torch.Tensor, torch.Tensor]]
                      ) -> Callable[..., torch.Tensor]:
    """down(act(gate) * up) where gate and up are the two halves of one projection (Phi3's `gate_up_proj`:
    `gate, up = linear(x, w_gate_up).chunk(2, dim=-1)`, or the halves sliced), the product either way round."""
    act = F.silu if activation == "silu" else functools.partial(
        F.gelu, approximate="tanh" if activation == "gelu_tanh" else "none")

    def search(x, w_gate_up, w_down):
        gate, up = halves(F.linear(x, w_gate_up))
        return F.linear(up * act(gate) if up_first else act(gate) * up, w_down)

    search.__qualname__ = search.__name__ = (f"{activation}_packed_gated_mlp{halves.__name__}"
                                             + ("_up_first" if up_first else ""))
    return search


def _packed_gated_mlp_fused(activation: str) -> Callable[..., torch.Tensor]:
    def replace(x, w_gate_up, w_down):
        return fused.gated_mlp_packed(x, w_gate_up, w_down, activation)

    replace.__qualname__ = replace.__name__ = f"{activation}_gated_mlp_packed_fused"
    return replace


def _half_of(node: object, source: torch.fx.Node | None, half: int, first: bool) -> torch.fx.Node | None:
    """The projection `node` is the first (or second) half of along its last dimension: `getitem(split(h, half, -1),
    0 or 1)` or `slice(h, last, 0, half)` / `slice(h, last, half, end)` (in the spelling of Note [Arguments are
    matched in one spelling]); None where it is not that half, or not of `source` when one is given."""
    if not isinstance(node, torch.fx.Node) or node.op != "call_function":
        return None
    if node.target is operator.getitem:
        split = node.args[0]
        if not (isinstance(split, torch.fx.Node) and split.target is torch.ops.aten.split.Tensor
                and len(split.args) == 3 and not split.kwargs and node.args[1] == (0 if first else 1)):
            return None
        h, size, dim = split.args
    elif node.target is torch.ops.aten.slice.Tensor and len(node.args) == 4 and not node.kwargs:
        h, dim, start, end = node.args
        if (start, end) != ((0, half) if first else (half, sys.maxsize)):
            return None
        size = half
    else:
        return None
    h_val = fake_value(h)
    # a slice's dim is non-negative and a split's negative (the Note's spelling): compared as the last dim
    if h_val is None or dim % max(h_val.dim(), 1) != h_val.dim() - 1 or size != half or h_val.shape[-1] != 2 * half \
            or source not in (None, h):
        return None
    return h


def _halves_in_order(match: Match) -> bool:
    """The packed MLP's halves are what the kernel computes: the product cut along its last dimension into exactly
    two halves, the first the activation's input and the second the other factor. The matcher's first pass ignores
    the cut's sizes and dims (torch re-traces the search function on the match's shapes, which compares them): the
    kernel's assumptions are checked here in its own terms all the same."""
    w = val(match, "w_gate_up")
    if w.dim() != 2 or w.shape[0] % 2:
        return False
    half = w.shape[0] // 2
    acts = [n for n in match.nodes if n.target in _PACKED_ACTIVATIONS]
    if len(acts) != 1 or len(acts[0].users) != 1:
        return False
    h = _half_of(acts[0].args[0], None, half, first=True)
    product = next(iter(acts[0].users))
    other = [a for a in product.args if a is not acts[0]]
    return h is not None and len(other) == 1 and _half_of(other[0], h, half, first=False) is h


_PACKED_ACTIVATIONS = (torch.ops.aten.silu.default, torch.ops.aten.gelu.default)


def linear(x, weight):  # a linear layer without bias (Llama's projections, an lm_head)
    return F.linear(x, weight)


def linear_bias(x, weight, bias):  # with a bias (Qwen2's q/k/v projections)
    return F.linear(x, weight, bias)


def matvec_fused(x, weight):
    return fused.matvec(x, weight)


def matvec_bias_fused(x, weight, bias):
    return fused.matvec(x, weight, bias)


def mm_kn(x, weight):  # x @ W with W stored [K, N] (GPT-2's Conv1D without its bias)
    return torch.mm(x, weight)


def addmm_kn(x, weight, bias):  # GPT-2's Conv1D: torch.addmm(bias, x.view(-1, K), W), W [K, N]
    return torch.addmm(bias, x, weight)


def matvec_kn_fused(x, weight):
    return fused.matvec(x, weight.t())


def matvec_kn_bias_fused(x, weight, bias):
    return fused.matvec(x, weight.t(), bias)


# Note [A float32 row runs matvec too]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# A decode step's linear layers are matrix-vector products that read each weight once. ATen's float32 mm on one
# row took 1.6-3x matvec's time over the same weights on this project's AMD EPYC (2026-12-06: Falcon's 17 linears
# 0.41-0.65x, Llama's 29 0.32-0.55x, the bench's 52.7 MB Llama 0.39-0.61x, at 1 and 2 threads; /tmp probes, the
# closing note of issue 21), where MKL does not take its fastest path. So a one-row F.linear on a row-major weight
# runs matvec in float32 as in bfloat16/float16 (four float32 accumulators per weight row, within the float32
# tolerance). The same holds for a float32 weight stored [K, N] (GPT-2's Conv1D, `addmm(b, x, W)`): matvec's
# columns kernel took 0.47-0.91x ATen's one-row addmm at 256x256 to 3072x768 and about its time at 4096x4096
# (0.88-1.07x, noisy; /tmp/s49/kn.py, 1 and 2 threads, 2026-12-06). The gated MLPs' three products (gated_mlp.cpp's
# products_run_matvec) run matvec on one row in float32 too, since 2026-12-06: fused / inductor on the float32 decode
# step went from 0.69x to 0.36x on Llama, 0.82x to 0.49x on Gemma2, 0.71x to 0.36x on Phi3 (bench.families, one
# thread); of several rows they stay eager's mm, bit for bit.
def _one_row(match: Match) -> bool:
    """matvec's case (csrc/fused/matvec.cpp): one row of x, float32, bfloat16 or float16, a row-major weight [N, K]
    (Note [A float32 row runs matvec too]). Several rows (a prefill: a GEMM) keep eager's mm."""
    x, w = val(match, "x"), val(match, "weight")
    if w.dim() != 2 or x.dim() < 1:
        return False
    return x.numel() == x.shape[-1] and tuple(w.stride()) == (w.shape[1], 1)


def _one_row_kn(match: Match) -> bool:
    """matvec's case for `x @ W`, W [K, N]: one row of x (2-d); W itself the transpose of a row-major [N, K] (a
    linear layer's `t(w)`), or W row-major (GPT-2's Conv1D, read as the transpose matvec takes: its columns
    kernel); a bias of one dimension [N]."""
    x, w = val(match, "x"), val(match, "weight")
    if w.dim() != 2 or x.dim() != 2 or x.shape[0] != 1:
        return False
    if "bias" in match.kwargs and (val(match, "bias").dim() != 1 or val(match, "bias").shape[0] != w.shape[1]):
        return False  # addmm broadcasts a bias of another shape; matvec takes [N]
    return tuple(w.stride()) in ((w.shape[1], 1), (1, w.shape[0]))


def silu_mul(gate, up):
    return F.silu(gate) * up


def up_mul_silu(gate, up):  # Phi3 and others: up * silu(gate) (a float product is the same either way round)
    return up * F.silu(gate)


def silu_mul_fused(gate, up):
    return fused.silu_mul(gate, up)


# ---- One-token attention over a KV cache ---------------------------------------------------------
#
_EPS = {"eps": 1e-6}  # scalar_workaround values must differ from every other number in the pattern


def _norm_checks(upcast: bool = False) -> tuple[Callable[[Match], bool], Callable[[Match], bool]]:
    """The norms' checks. A form without the float32 upcast declines float16: eager squares in float16, which
    overflows past |x| = 256 (the row becomes 0: rsqrt(inf)) and loses the squares of |x| < 2^-12 to subnormals, where
    the kernel's float32 squares do not (found by a helper); bfloat16 has float32's range, and its rounded squares
    stay within the tolerance. The upcast forms square in float32, as the kernel does."""
    dtype_ok = (lambda match: True) if upcast else not_dtype("x", torch.float16)
    norm_ok = all_of(float_cpu("x", "weight"), dtype_ok, number("eps"), _row_weight)
    add_ok = all_of(float_cpu("x", "residual", "weight"), dtype_ok, number("eps"), _same_shape("x", "residual"),
                    _row_weight)
    return norm_ok, add_ok


def register_common() -> None:
    """The patterns whose ops name no dtype: they match float32, bfloat16 and float16 graphs alike."""
    t = torch.randn
    x3, r3, w = t(2, 3, 16), t(2, 3, 16), t(16)
    norm_ok, add_ok = _norm_checks()
    # Gemma's (1 + w) forms first: each contains a plain form whose weight would be the `1 + w` node, computed
    # by eager's add on every call
    for search, replacement in ((add_rms_norm_gemma, add_rms_norm_gemma_fused), (add_rms_norm, add_rms_norm_fused),
                                (add_rms_norm_llama, add_rms_norm_fused)):
        register_named("add_rms_norm", search, replacement, [x3, r3, w], extra_check=add_ok,
                       scalar_workaround=_EPS, builtin=True)
    for search, replacement in ((rms_norm_gemma, rms_norm_gemma_fused), (rms_norm, rms_norm_fused),
                                (rms_norm_llama, rms_norm_fused)):
        register_named("rms_norm", search, replacement, [x3, w], extra_check=norm_ok, scalar_workaround=_EPS,
                       builtin=True)

    for search, replacement, params in ((add_layer_norm, add_layer_norm_fused, ("weight", "bias")),
                                        (add_layer_norm_no_bias, add_layer_norm_no_bias_fused, ("weight",)),
                                        (add_layer_norm_no_affine, add_layer_norm_no_affine_fused, ())):
        register_named("add_layer_norm", search, replacement, [x3, r3, *[t(16) for _ in params]],
                       extra_check=all_of(float_cpu("x", "residual", *params), number("eps"),
                                          _same_shape("x", "residual"), _layer_norm_params(*params)),
                       scalar_workaround={"eps": 1e-5}, builtin=True)

    wg, wu, wd = t(32, 16), t(32, 16), t(16, 32)
    mlp_ok = float_cpu("x", "w_gate", "w_up", "w_down")
    for x in (x3, t(3, 16)):
        register_named("gated_mlp", gated_mlp, gated_mlp_fused, [x, wg, wu, wd], extra_check=mlp_ok, builtin=True)
        for approximate in ("none", "tanh"):
            for up_first in (False, True):
                register_named("gated_mlp", _gelu_gated_mlp(approximate, up_first), _gelu_gated_mlp_fused(approximate),
                               [x, wg, wu, wd], extra_check=mlp_ok, builtin=True)
        for activation, up_first, halves in itertools.product(("silu", "gelu", "gelu_tanh"), (True, False),
                                                              (_chunk_halves, _slice_halves)):
            register_named("gated_mlp_packed", _packed_gated_mlp(activation, up_first, halves),
                           _packed_gated_mlp_fused(activation), [x, t(64, 16), wd],
                           extra_check=all_of(float_cpu("x", "w_gate_up", "w_down"), _halves_in_order), builtin=True)
    for search in (silu_mul, up_mul_silu):
        register_named("silu_mul", search, silu_mul_fused, [t(2, 3, 32), t(2, 3, 32)],
                       extra_check=all_of(float_cpu("gate", "up"), _same_shape("gate", "up")), builtin=True)

    register_rotary()  # rotary_patterns.py

    register_attention(None)  # Note [Attention forms are generated from one table]

    # one-row linear layers, last: after every pattern that contains a linear (Note [A float32 row runs matvec too])
    w, b = t(32, 16), t(32)
    for x in (t(1, 1, 16), t(1, 16)):
        register_named("matvec", linear, matvec_fused, [x, w],
                       extra_check=all_of(float_cpu("x", "weight"), _one_row), builtin=True)
        register_named("matvec", linear_bias, matvec_bias_fused, [x, w, b],
                       extra_check=all_of(float_cpu("x", "weight", "bias"), _one_row), builtin=True)
    # a product written `x @ W` with W [K, N] (a linear's t(w) seen as mm, GPT-2's Conv1D), after F.linear's forms
    x2, w_kn, b_kn = t(1, 16), t(16, 32), t(32)
    register_named("matvec", mm_kn, matvec_kn_fused, [x2, w_kn],
                   extra_check=all_of(float_cpu("x", "weight"), _one_row_kn), builtin=True)
    register_named("matvec", addmm_kn, matvec_kn_bias_fused, [x2, w_kn, b_kn],
                   extra_check=all_of(float_cpu("x", "weight", "bias"), _one_row_kn), builtin=True)


def register_upcast(dtype: torch.dtype) -> None:
    """The float32-upcast forms of a `dtype` model: Llama's norm and a float32 softmax, whose casts back name
    `dtype` (Note [Built-in patterns are traced per dtype, when needed], manager.py)."""
    t = torch.randn
    x3, r3, w = t(2, 3, 16).to(dtype), t(2, 3, 16).to(dtype), t(16).to(dtype)
    norm_ok, add_ok = _norm_checks(upcast=True)
    register_named("add_rms_norm", add_rms_norm_upcast, add_rms_norm_fused, [x3, r3, w], extra_check=add_ok,
                   scalar_workaround=_EPS, builtin=True)
    register_named("rms_norm", rms_norm_upcast, rms_norm_fused, [x3, w], extra_check=norm_ok,
                   scalar_workaround=_EPS, builtin=True)
    register_attention(dtype)


# The built-in patterns, by group: None for the common ones, a dtype for its upcast forms (traced when a graph of
# that dtype is first fused: Note [Built-in patterns are traced per dtype, when needed], manager.py).
BUILTIN_GROUPS: dict[torch.dtype | str | None, Callable[[], None]] = {
    None: register_common,
    torch.bfloat16: lambda: register_upcast(torch.bfloat16),
    torch.float16: lambda: register_upcast(torch.float16),
}
