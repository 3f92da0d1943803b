"""The built-in patterns of fused mode: what Llama-style decoders spend their CPU time on.

Each search function is written the way models write it (this repo's examples/models/decoder.py
and transformers' Llama modules); tracing it gives the ATen graph AOTAutograd makes of that code,
and the replacement calls a graphex_fused op (csrc/fused/). Every pattern's extra check admits
CPU tensors of one dtype, float32, bfloat16 or float16, so other dtypes keep eager's kernels (exact). Registered in priority
order: a pattern that contains another comes first (Note in manager.py).

    add_rms_norm   (x + residual, rms_norm(x + residual) * w)           2 forms (x*r*w, w*(x*r))
    rms_norm       x * rsqrt(mean(x^2, -1) + eps) * w                   2 forms, and Llama's float32 upcast in
                                                                        bfloat16 / float16 models
    gated_mlp      down(silu(gate(x)) * up(x)) as three matmuls + one pass   3-d and 2-d x
    silu_mul       silu(gate) * up, or up * silu(gate) (Phi3's fused gate_up projection, chunked)
    rotary         x * cos + rotate_half(x) * sin                       chunk and slice forms
    matvec         F.linear(x, w[, b]) on one row of a bfloat16/float16 x (a decode step's projections)
    decode_attention  softmax(q k^T * s, masked) v for one query token, SDPA or written out, GQA by repeat_kv
                   or repeat_interleave or none, scale given (or divided by) or SDPA's default, a bool or
                   additive float mask or none: Note [Attention forms are generated from one table]
"""

from __future__ import annotations

import math
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch._inductor.pattern_matcher import Match

from .. import _C  # noqa: F401  (registers the graphex_fused:: kernels used below)

from .registration import register_named

fused = torch.ops.graphex_fused


def _val(match: Match, name: str) -> Any:
    node = match.kwargs[name]
    return node.meta.get("val") if isinstance(node, torch.fx.Node) else node


_FUSED_DTYPES = (torch.float32, torch.bfloat16, torch.float16)  # the kernels' fast paths (csrc/fused/rows.h)


def _float_cpu(*names: str) -> Callable[[Match], bool]:
    """Admit a match when the named inputs are CPU tensors of one dtype, float32, bfloat16 or float16 (the
    fast paths of the kernels; Note [Reduced precision runs the float32 rows]), of static shapes: the checks
    compare sizes, which on a dynamic=True graph's symbolic sizes would add guards that the captured program
    does not check, so those graphs are left exact."""
    def check(match: Match) -> bool:
        dtypes = set()
        for name in names:
            v = _val(match, name)
            if not isinstance(v, torch.Tensor) or v.dtype not in _FUSED_DTYPES or v.device.type != "cpu":
                return False
            if not all(type(d) is int for d in (*v.shape, *v.stride())):
                return False
            dtypes.add(v.dtype)
        if len(dtypes) > 1:  # mixed dtypes promote: not what a one-dtype kernel computes
            return False
        return True

    return check


def _number(name: str) -> Callable[[Match], bool]:
    """A scalar argument is a number in the graph (with dynamic=True it may be a graph input instead)."""
    return lambda match: type(match.kwargs.get(name)) in (float, int)


def _all(*checks: Callable[[Match], bool]) -> Callable[[Match], bool]:
    return lambda match: all(c(match) for c in checks)


# ---- RMSNorm and add + RMSNorm ------------------------------------------------------------------

def rms_norm(x, weight, eps):  # examples/models/decoder.py's RMSNorm
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def rms_norm_llama(x, weight, eps):  # transformers' LlamaRMSNorm on float32 (its .to()s are no-ops)
    return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def rms_norm_upcast(x, weight, eps):  # transformers' LlamaRMSNorm on bfloat16/float16: the norm in float32
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


def rms_norm_fused(x, weight, eps):
    return fused.rms_norm(x, weight, eps)


def add_rms_norm(x, residual, weight, eps):
    h = x + residual
    return rms_norm(h, weight, eps), h


def add_rms_norm_llama(x, residual, weight, eps):
    h = x + residual
    return rms_norm_llama(h, weight, eps), h


def add_rms_norm_upcast(x, residual, weight, eps):
    h = x + residual
    return rms_norm_upcast(h, weight, eps), h


def add_rms_norm_fused(x, residual, weight, eps):
    h, y = fused.add_rms_norm(x, residual, weight, eps)
    return y, h


def _same_shape(a: str, b: str) -> Callable[[Match], bool]:
    return lambda match: tuple(_val(match, a).shape) == tuple(_val(match, b).shape)


def _row_weight(match: Match) -> bool:
    """The norm's weight is one row (what RMSNorm has): the kernel's output is then x's shape."""
    x, w = _val(match, "x"), _val(match, "weight")
    return w.dim() == 1 and x.dim() >= 1 and w.shape[0] == x.shape[-1]


# ---- SiLU-gated MLP -------------------------------------------------------------------------------

def gated_mlp(x, w_gate, w_up, w_down):
    return F.linear(F.silu(F.linear(x, w_gate)) * F.linear(x, w_up), w_down)


def gated_mlp_fused(x, w_gate, w_up, w_down):
    return fused.gated_mlp(x, w_gate, w_up, w_down)


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


def _one_row_reduced(match: Match) -> bool:
    """matvec's case (csrc/fused/matvec.cpp): one row of x, bfloat16 or float16, a row-major weight [N, K]. A
    float32 linear keeps eager's mm (no faster with a kernel of ours), as do several rows (a prefill: a GEMM)."""
    x, w = _val(match, "x"), _val(match, "weight")
    if x.dtype not in (torch.bfloat16, torch.float16) or w.dim() != 2 or x.dim() < 1:
        return False
    return x.numel() == x.shape[-1] and tuple(w.stride()) == (w.shape[1], 1)


def _one_row_reduced_kn(match: Match) -> bool:
    """matvec's case for `x @ W`, W [K, N]: one row of x (2-d), bfloat16 or float16, W row-major (read as the
    transpose matvec takes) or itself the transpose of a row-major [N, K]; a bias of one dimension [N]."""
    x, w = _val(match, "x"), _val(match, "weight")
    if x.dtype not in (torch.bfloat16, torch.float16) or w.dim() != 2 or x.dim() != 2 or x.shape[0] != 1:
        return False
    if "bias" in match.kwargs and (_val(match, "bias").dim() != 1 or _val(match, "bias").shape[0] != w.shape[1]):
        return False  # addmm broadcasts a bias of another shape; matvec takes [N]
    return tuple(w.stride()) in ((w.shape[1], 1), (1, w.shape[0]))


def silu_mul(gate, up):
    return F.silu(gate) * up


def up_mul_silu(gate, up):  # Phi3 and others: up * silu(gate) (a float product is the same either way round)
    return up * F.silu(gate)


def silu_mul_fused(gate, up):
    return fused.silu_mul(gate, up)


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
    x, cos, sin = _val(match, "x"), _val(match, "cos"), _val(match, "sin")
    if x.dim() < 1 or x.shape[-1] % 2 or cos.shape[-1] != x.shape[-1] or sin.shape[-1] != x.shape[-1]:
        return False
    return tuple(torch.broadcast_shapes(x.shape, cos.shape, sin.shape)) == tuple(x.shape)


# ---- One-token attention over a KV cache ---------------------------------------------------------
#
# Note [Attention forms are generated from one table]
# Attention reaches the graph in many spellings that mean the same thing: SDPA or written out
# (matmul, scale, masked_fill, softmax, matmul), the scale given, divided by or SDPA's default,
# grouped-query heads repeated by repeat_kv (expand + reshape) or repeat_interleave or not at all, a
# bool mask (masked_fill(~mask, -inf) written out), an additive float mask (`scores + mask`, -inf where
# masked, what SDPA's float attn_mask means) or none. Each combination is one search function below, made from the table (_GQA and
# the flags) so that the rules are written once; all are replaced by the one kernel,
# graphex_fused::decode_attention, which reads grouped heads natively (query head h reads key/value
# head h // n, the head both repeats give it). torch's matcher retraces every match with its real
# shapes (the repeat count and dims, the scale), so a form fires only where the graph is exactly
# what the search function computes on those shapes, and _one_token takes only a mask of the form's
# kind that broadcasts to the scores without growing them. Per form, what eager gives a row masked
# everywhere: SDPA 0 (zero_masked_rows), a written-out softmax over all -inf NaN.

def _repeat_kv(x, n_rep):  # transformers' repeat_kv (grouped-query attention)
    b, h, s, d = x.shape
    return x[:, :, None, :, :].expand(b, h, n_rep, s, d).reshape(b, h * n_rep, s, d)


def _repeat_interleave(x, n_rep):
    return x.repeat_interleave(n_rep, dim=1)


def _no_repeat(x, n_rep):
    return x


_GQA = {"repeat_kv": _repeat_kv, "repeat_interleave": _repeat_interleave, "none": _no_repeat}


_MASKS = ("bool", "additive", "none")  # the mask kinds; a bool mask attends where true, an additive one is added


def _sdpa_form(gqa: str, scaled: bool, mask_kind: str) -> Callable[..., Any]:
    """F.scaled_dot_product_attention after one GQA form, with or without scale= and a mask of one kind."""
    rep = _GQA[gqa]
    masked = mask_kind != "none"

    def n(q, k):
        return q.shape[1] // k.shape[1]

    if scaled and masked:
        def search(q, k, v, mask, scale):
            return F.scaled_dot_product_attention(q, rep(k, n(q, k)), rep(v, n(q, k)), attn_mask=mask, scale=scale)
    elif masked:
        def search(q, k, v, mask):
            return F.scaled_dot_product_attention(q, rep(k, n(q, k)), rep(v, n(q, k)), attn_mask=mask)
    elif scaled:
        def search(q, k, v, scale):
            return F.scaled_dot_product_attention(q, rep(k, n(q, k)), rep(v, n(q, k)), scale=scale)
    else:
        def search(q, k, v):
            return F.scaled_dot_product_attention(q, rep(k, n(q, k)), rep(v, n(q, k)))
    search.__qualname__ = search.__name__ = (f"sdpa_{gqa}_{'scale' if scaled else 'default_scale'}_"
                                             f"{mask_kind}_mask")
    return search


def _sdpa_fused_form(scaled: bool, masked: bool) -> Callable[..., Any]:
    def default_scale(q):
        return 1.0 / math.sqrt(q.shape[-1])  # ATen's sdpa: 1 / sqrt(E)

    if scaled and masked:
        def replace(q, k, v, mask, scale):
            return fused.decode_attention(q, k, v, mask, scale, zero_masked_rows=True)
    elif masked:
        def replace(q, k, v, mask):
            return fused.decode_attention(q, k, v, mask, default_scale(q), zero_masked_rows=True)
    elif scaled:
        def replace(q, k, v, scale):
            return fused.decode_attention(q, k, v, _all_attended(q, k), scale, zero_masked_rows=True)
    else:
        def replace(q, k, v):
            return fused.decode_attention(q, k, v, _all_attended(q, k), default_scale(q), zero_masked_rows=True)
    replace.__qualname__ = replace.__name__ = f"sdpa_fused_{'scale' if scaled else 'default_scale'}_{'mask' if masked else 'no_mask'}"
    return replace


def _written_form(gqa: str, divide: bool, mask_kind: str, upcast: bool = False) -> Callable[..., Any]:
    """softmax(q k^T * scale (or / inv_scale), then masked_fill(~mask, -inf) or + mask) v, after one GQA form;
    `upcast`: the softmax in float32 and cast back to q's dtype (softmax(s.float()).to(q.dtype), or
    softmax(s, dtype=torch.float32).to(q.dtype): one graph after Note [Arguments are matched in one
    spelling]'s rewrite of _to_copy), traced per reduced dtype since the cast back names it."""
    rep = _GQA[gqa]

    def masked(scores, mask):
        if mask_kind == "none":
            return scores
        return scores.masked_fill(~mask, float("-inf")) if mask_kind == "bool" else scores + mask

    def probs(scores, q):
        return torch.softmax(scores.float(), dim=-1).to(q.dtype) if upcast else torch.softmax(scores, dim=-1)

    def attend(q, k, v, mask, scaled):
        n = q.shape[1] // k.shape[1]
        scores = masked(scaled(torch.matmul(q, rep(k, n).transpose(2, 3))), mask)
        return torch.matmul(probs(scores, q), rep(v, n))

    if mask_kind == "none" and divide:
        def search(q, k, v, inv_scale):
            return attend(q, k, v, None, lambda s: s / inv_scale)
    elif mask_kind == "none":
        def search(q, k, v, scale):
            return attend(q, k, v, None, lambda s: s * scale)
    elif divide:
        def search(q, k, v, mask, inv_scale):  # examples/models/decoder.py's Attention
            return attend(q, k, v, mask, lambda s: s / inv_scale)
    else:
        def search(q, k, v, mask, scale):
            return attend(q, k, v, mask, lambda s: s * scale)
    search.__qualname__ = search.__name__ = (f"written_attention_{gqa}_{'div' if divide else 'mul'}_{mask_kind}_mask"
                                             f"{'_upcast' if upcast else ''}")
    return search


def decode_attention_fused(q, k, v, mask, inv_scale):
    return fused.decode_attention(q, k, v, mask, 1.0 / inv_scale)  # a row masked everywhere: NaN, as softmax gives


def written_attention_fused(q, k, v, mask, scale):
    return fused.decode_attention(q, k, v, mask, scale)


def _all_attended(q, k):  # no mask: every cached position is attended (as SDPA without attn_mask does)
    return torch.ones((1, 1, 1, k.shape[2]), dtype=torch.bool, device=q.device)


def unmasked_attention_fused_div(q, k, v, inv_scale):
    return fused.decode_attention(q, k, v, _all_attended(q, k), 1.0 / inv_scale)


def unmasked_attention_fused(q, k, v, scale):
    return fused.decode_attention(q, k, v, _all_attended(q, k), scale)


def _one_token(mask_kind: str) -> Callable[[Match], bool]:
    def check(match: Match) -> bool:
        return _one_token_with(match, mask_kind)

    return check


def _one_token_with(match: Match, mask_kind: str) -> bool:
    q, k, v = (_val(match, n) for n in ("q", "k", "v"))
    mask = _val(match, "mask") if "mask" in match.kwargs else None
    if q.dim() != 4 or k.dim() != 4 or tuple(k.shape) != tuple(v.shape):
        return False
    if (mask is None) != (mask_kind == "none"):
        return False
    if mask is not None:
        want = torch.bool if mask_kind == "bool" else q.dtype
        if not isinstance(mask, torch.Tensor) or mask.dtype != want or mask.dim() > 4:
            return False
    if q.shape[2] != 1 or q.shape[0] != k.shape[0] or q.shape[3] != k.shape[3]:
        return False
    if k.shape[1] == 0 or q.shape[1] % k.shape[1] or k.shape[2] == 0:  # no heads, or an empty cache: left to eager
        return False
    if mask is not None:  # a mask that grows the scores (more rows, batches or heads) is not the kernel's
        scores = (q.shape[0], q.shape[1], 1, k.shape[2])
        try:
            if tuple(torch.broadcast_shapes(mask.shape, scores)) != scores:
                return False
        except RuntimeError:
            return False
    return True


def _attention_examples() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, dict[str, list[torch.Tensor]]]:
    t = torch.randn
    masks = {"bool": [torch.ones(1, 1, 1, 6, dtype=torch.bool)], "additive": [torch.zeros(1, 1, 1, 6)], "none": []}
    return t(1, 4, 1, 8), t(1, 2, 6, 8), t(1, 4, 6, 8), masks


def _register_written_attention(dtype: torch.dtype | None) -> None:
    """The written-out attention forms: float32 ones (dtype None; where softmax(s.float()).to(q.dtype) is
    softmax(s)), or the float32 softmax of a `dtype` model (transformers' eager attention, this repo's decoder)."""
    q, kv, k_full, masks = _attention_examples()

    def cast(ts: list[torch.Tensor]) -> list[torch.Tensor]:
        return [x.to(dtype) if dtype is not None and x.is_floating_point() else x for x in ts]

    for gqa in ("repeat_kv", "repeat_interleave", "none"):
        k = k_full if gqa == "none" else kv
        for kind in _MASKS:
            written_ok = _all(_float_cpu("q", "k", "v"), _one_token(kind))
            unmasked, upcast = kind == "none", dtype is not None
            register_named("decode_attention", _written_form(gqa, True, kind, upcast),
                           unmasked_attention_fused_div if unmasked else decode_attention_fused,
                           cast([q, k, k.clone(), *masks[kind]]), extra_check=_all(written_ok, _number("inv_scale")),
                           scalar_workaround={"inv_scale": 7.25}, builtin=True)
            register_named("decode_attention", _written_form(gqa, False, kind, upcast),
                           unmasked_attention_fused if unmasked else written_attention_fused,
                           cast([q, k, k.clone(), *masks[kind]]), extra_check=_all(written_ok, _number("scale")),
                           scalar_workaround={"scale": 0.3125}, builtin=True)


_EPS = {"eps": 1e-6}  # scalar_workaround values must differ from every other number in the pattern


def _norm_checks() -> tuple[Callable[[Match], bool], Callable[[Match], bool]]:
    norm_ok = _all(_float_cpu("x", "weight"), _number("eps"), _row_weight)
    add_ok = _all(_float_cpu("x", "residual", "weight"), _number("eps"), _same_shape("x", "residual"), _row_weight)
    return norm_ok, add_ok


def register_common() -> None:
    """The patterns whose ops name no dtype: they match float32, bfloat16 and float16 graphs alike."""
    t = torch.randn
    x3, r3, w = t(2, 3, 16), t(2, 3, 16), t(16)
    norm_ok, add_ok = _norm_checks()
    for search in (add_rms_norm, add_rms_norm_llama):
        register_named("add_rms_norm", search, add_rms_norm_fused, [x3, r3, w], extra_check=add_ok,
                       scalar_workaround=_EPS, builtin=True)
    for search in (rms_norm, rms_norm_llama):
        register_named("rms_norm", search, rms_norm_fused, [x3, w], extra_check=norm_ok, scalar_workaround=_EPS,
                       builtin=True)

    wg, wu, wd = t(32, 16), t(32, 16), t(16, 32)
    mlp_ok = _float_cpu("x", "w_gate", "w_up", "w_down")
    for x in (x3, t(3, 16)):
        register_named("gated_mlp", gated_mlp, gated_mlp_fused, [x, wg, wu, wd], extra_check=mlp_ok, builtin=True)
    for search in (silu_mul, up_mul_silu):
        register_named("silu_mul", search, silu_mul_fused, [t(2, 3, 32), t(2, 3, 32)],
                       extra_check=_all(_float_cpu("gate", "up"), _same_shape("gate", "up")), builtin=True)

    rot_ok = _all(_float_cpu("x", "cos", "sin"), _rotary_shapes)
    for search in (rotary, rotary_slices):
        register_named("rotary", search, rotary_fused, [t(1, 2, 3, 8), t(1, 1, 3, 8), t(1, 1, 3, 8)],
                       extra_check=rot_ok, builtin=True)

    # Note [Attention forms are generated from one table]: the GQA forms before the plain one (a GQA match
    # contains the plain form's), written-out forms anchored at their last matmul, SDPA at its call.
    _register_written_attention(None)
    q, kv, k_full, masks = _attention_examples()
    for gqa in ("repeat_kv", "repeat_interleave", "none"):
        k = k_full if gqa == "none" else kv
        for scaled in (True, False):
            for kind in _MASKS:
                masked = kind != "none"
                inputs = [q, k, k.clone(), *masks[kind]]
                checks = [_float_cpu("q", "k", "v"), _one_token(kind)] + ([_number("scale")] if scaled else [])
                register_named("decode_attention", _sdpa_form(gqa, scaled, kind), _sdpa_fused_form(scaled, masked),
                               inputs, extra_check=_all(*checks),
                               scalar_workaround={"scale": 0.3125} if scaled else None, builtin=True)


def register_upcast(dtype: torch.dtype) -> None:
    """The float32-upcast forms of a `dtype` model: Llama's norm and a float32 softmax, whose casts back name
    `dtype` (Note [Built-in patterns are traced per dtype, when needed], manager.py)."""
    t = torch.randn
    x3, r3, w = t(2, 3, 16).to(dtype), t(2, 3, 16).to(dtype), t(16).to(dtype)
    norm_ok, add_ok = _norm_checks()
    register_named("add_rms_norm", add_rms_norm_upcast, add_rms_norm_fused, [x3, r3, w], extra_check=add_ok,
                   scalar_workaround=_EPS, builtin=True)
    register_named("rms_norm", rms_norm_upcast, rms_norm_fused, [x3, w], extra_check=norm_ok,
                   scalar_workaround=_EPS, builtin=True)
    _register_written_attention(dtype)


def register_matvec() -> None:
    """Linear layers on one row in bfloat16/float16 (a decode step's projections), and `x @ W` with W stored
    [K, N] (GPT-2's Conv1D): matvec reads the weights at their own width. Registered after every pattern that contains a linear (gated_mlp), traced once for both
    reduced dtypes (its ops name no dtype)."""
    t = torch.randn
    w, b = t(32, 16).bfloat16(), t(32).bfloat16()
    for x in (t(1, 1, 16).bfloat16(), t(1, 16).bfloat16()):
        register_named("matvec", linear, matvec_fused, [x, w],
                       extra_check=_all(_float_cpu("x", "weight"), _one_row_reduced), builtin=True)
        register_named("matvec", linear_bias, matvec_bias_fused, [x, w, b],
                       extra_check=_all(_float_cpu("x", "weight", "bias"), _one_row_reduced), builtin=True)
    # a product written with the weight stored [K, N] (GPT-2's Conv1D), after F.linear's forms
    x2, w_kn, b_kn = t(1, 16).bfloat16(), t(16, 32).bfloat16(), t(32).bfloat16()
    register_named("matvec", mm_kn, matvec_kn_fused, [x2, w_kn],
                   extra_check=_all(_float_cpu("x", "weight"), _one_row_reduced_kn), builtin=True)
    register_named("matvec", addmm_kn, matvec_kn_bias_fused, [x2, w_kn, b_kn],
                   extra_check=_all(_float_cpu("x", "weight", "bias"), _one_row_reduced_kn), builtin=True)


# The built-in patterns, by group: None for the common ones, a dtype for its upcast forms (traced when a graph of
# that dtype is first fused: Note [Built-in patterns are traced per dtype, when needed], manager.py).
BUILTIN_GROUPS: dict[torch.dtype | str | None, Callable[[], None]] = {
    None: register_common,
    torch.bfloat16: lambda: register_upcast(torch.bfloat16),
    torch.float16: lambda: register_upcast(torch.float16),
    "reduced": register_matvec,  # traced with the first bfloat16 or float16 graph, after its dtype's group
}
