"""A small decoder whose every part can be spelled the ways real model code spells it (sweeps/fusion_coverage.py).

One `Spelling` picks, per part, one way of writing it; the decoder then decodes one token at a time over a static
KV cache written in place (`index_copy_`), the way examples/models/decoder.py and transformers' StaticCache do.
The spellings are the forms issue 21 lists: what fused mode should catch by meaning, not by one spelling.

    norm       rms (x * rsqrt(mean(x^2) + eps) * w), llama (w * (x * rsqrt(...))), upcast (the same in float32,
               cast back), gemma ((1 + w), upcast), eps_outside (x / (sqrt(mean(x^2)) + eps): another meaning),
               layernorm (F.layer_norm)
    attention  sdpa (F.scaled_dot_product_attention), written (softmax(q k^T * scale + mask) v), written_upcast
               (the scores' softmax in float32, cast back)
    gqa        none (as many key/value heads as query heads), repeat_kv (expand + reshape), repeat_interleave
    mask       bool (True: attend), additive (0 / -inf float), none (no mask: attends to the cache's unwritten,
               zero rows too, which is what the code says)
    scale      default (1/sqrt(d)), given (an explicit 0.2)
    mlp        silu_gated, gelu_gated (erf), gelu_tanh_gated, fused_gate_up (one matmul, chunked: Phi3), ungated
               (GELU, GPT-2 style)
    rotary     half (rotate_half by chunk), slices (rotate_half by slices), interleaved (pairs), partial (the
               first half of each head rotated), complex (Meta's Llama: the pairs as complex numbers times freqs_cis)
    dtype      float32, bfloat16
"""

from __future__ import annotations

import dataclasses
import math
import random
from typing import Iterator

import torch
import torch.nn.functional as F
from torch import nn

AXES: dict[str, tuple[str, ...]] = {
    "norm": ("rms", "llama", "upcast", "gemma", "eps_outside", "layernorm"),
    "attention": ("sdpa", "written", "written_upcast"),
    "gqa": ("repeat_kv", "none", "repeat_interleave"),
    "mask": ("bool", "additive", "none"),
    "scale": ("default", "given"),
    "mlp": ("silu_gated", "gelu_gated", "gelu_tanh_gated", "fused_gate_up", "ungated"),
    "rotary": ("half", "slices", "interleaved", "partial", "complex"),
    "dtype": ("float32", "bfloat16"),
}


@dataclasses.dataclass(frozen=True)
class Spelling:
    norm: str = "rms"
    attention: str = "sdpa"
    gqa: str = "repeat_kv"
    mask: str = "bool"
    scale: str = "default"
    mlp: str = "silu_gated"
    rotary: str = "half"
    dtype: str = "float32"

    @property
    def name(self) -> str:
        base = Spelling()
        changed = [f"{k}={v}" for k, v in dataclasses.asdict(self).items() if getattr(base, k) != v]
        return ",".join(changed) or "baseline"


def variants(count: int | None = None, seed: int = 0) -> list[Spelling]:
    """The baseline, then each spelling of each part alone, then seeded random combinations (up to `count` in all)."""
    found = [Spelling()]
    for axis, values in AXES.items():
        found += [Spelling(**{axis: v}) for v in values[1:]]
    rng = random.Random(seed)
    seen = {s.name for s in found}
    tries = 0
    while (count is None or len(found) < count) and tries < 10_000 and count is not None:
        tries += 1
        s = Spelling(**{axis: rng.choice(values) for axis, values in AXES.items()})
        if s.name not in seen:
            seen.add(s.name)
            found.append(s)
    return found if count is None else found[:count]


@dataclasses.dataclass(frozen=True)
class Sizes:
    vocab: int = 128
    hidden: int = 64
    heads: int = 4
    kv_heads: int = 2
    layers: int = 2
    intermediate: int = 128
    max_positions: int = 32
    eps: float = 1e-6

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


class Norm(nn.Module):
    def __init__(self, s: Spelling, z: Sizes) -> None:
        super().__init__()
        self.kind, self.eps = s.norm, z.eps
        init = torch.zeros(z.hidden) if s.norm == "gemma" else torch.ones(z.hidden)
        self.weight = nn.Parameter(init + 0.1 * torch.randn(z.hidden))
        if s.norm == "layernorm":
            self.bias = nn.Parameter(0.1 * torch.randn(z.hidden))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        k, eps, w = self.kind, self.eps, self.weight
        if k == "rms":
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w
        if k == "llama":
            return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))
        if k == "upcast":
            h = x.float()
            h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
            return w * h.to(x.dtype)
        if k == "gemma":
            h = x.float()
            h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
            return (h * (1.0 + w.float())).to(x.dtype)
        if k == "eps_outside":
            return x / (x.pow(2).mean(-1, keepdim=True).sqrt() + eps) * w
        if k == "layernorm":
            return F.layer_norm(x, (x.shape[-1],), w, self.bias, eps)
        raise ValueError(k)


def _rotate_half(x: torch.Tensor, kind: str) -> torch.Tensor:
    if kind == "slices":
        x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    else:
        x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def _rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, kind: str) -> torch.Tensor:
    if kind == "complex":  # Meta's apply_rotary_emb: `cos` is freqs_cis here, e^(i theta) per pair (complex64)
        pairs = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
        return torch.view_as_real(pairs * cos).flatten(3).type_as(x)
    if kind == "interleaved":  # pairs (x0, x1), (x2, x3), ...: rotate each pair
        x1, x2 = x[..., 0::2], x[..., 1::2]
        c, s = cos[..., 0::2], sin[..., 0::2]
        return torch.stack((x1 * c - x2 * s, x1 * s + x2 * c), dim=-1).flatten(-2)
    if kind == "partial":  # the first half of each head rotated, the rest passed through
        d = x.shape[-1] // 2
        rot, rest = x[..., :d], x[..., d:]
        c, s = cos[..., : d // 2].repeat(1, 1, 1, 2), sin[..., : d // 2].repeat(1, 1, 1, 2)
        return torch.cat((rot * c + _rotate_half(rot, "half") * s, rest), dim=-1)
    return x * cos + _rotate_half(x, kind) * sin


class Attention(nn.Module):
    def __init__(self, s: Spelling, z: Sizes) -> None:
        super().__init__()
        self.s, self.z = s, z
        kv = z.heads if s.gqa == "none" else z.kv_heads
        self.kv_heads = kv
        self.q = nn.Linear(z.hidden, z.heads * z.head_dim, bias=False)
        self.k = nn.Linear(z.hidden, kv * z.head_dim, bias=False)
        self.v = nn.Linear(z.hidden, kv * z.head_dim, bias=False)
        self.o = nn.Linear(z.heads * z.head_dim, z.hidden, bias=False)

    def _repeat(self, x: torch.Tensor) -> torch.Tensor:
        n = self.z.heads // self.kv_heads
        if self.s.gqa == "repeat_kv":
            b, h, t, d = x.shape
            return x[:, :, None, :, :].expand(b, h, n, t, d).reshape(b, h * n, t, d)
        if self.s.gqa == "repeat_interleave":
            return x.repeat_interleave(n, dim=1)
        return x

    def forward(self, x, pos, cos, sin, k_cache, v_cache, mask):
        z, s = self.z, self.s
        b, t, _ = x.shape
        q = self.q(x).view(b, t, z.heads, z.head_dim).transpose(1, 2)
        k = self.k(x).view(b, t, self.kv_heads, z.head_dim).transpose(1, 2)
        v = self.v(x).view(b, t, self.kv_heads, z.head_dim).transpose(1, 2)
        q, k = _rotary(q, cos, sin, s.rotary), _rotary(k, cos, sin, s.rotary)
        k_cache.index_copy_(2, pos, k)
        v_cache.index_copy_(2, pos, v)
        keys, values = self._repeat(k_cache), self._repeat(v_cache)
        scale = 0.2 if s.scale == "given" else 1.0 / math.sqrt(z.head_dim)
        if s.attention == "sdpa":
            out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask,
                                                 scale=scale if s.scale == "given" else None)
        else:
            scores = torch.matmul(q, keys.transpose(2, 3)) * scale
            if mask is not None:
                scores = scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else scores + mask
            if s.attention == "written_upcast":
                probs = torch.softmax(scores.float(), dim=-1).to(q.dtype)
            else:
                probs = torch.softmax(scores, dim=-1)
            out = torch.matmul(probs, values)
        return self.o(out.transpose(1, 2).reshape(b, t, z.heads * z.head_dim))


class MLP(nn.Module):
    def __init__(self, s: Spelling, z: Sizes) -> None:
        super().__init__()
        self.kind = s.mlp
        if s.mlp == "fused_gate_up":
            self.gate_up = nn.Linear(z.hidden, 2 * z.intermediate, bias=False)
        else:
            self.gate = nn.Linear(z.hidden, z.intermediate, bias=False)
            self.up = nn.Linear(z.hidden, z.intermediate, bias=False)
        self.down = nn.Linear(z.intermediate, z.hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        k = self.kind
        if k == "fused_gate_up":
            gate, up = self.gate_up(x).chunk(2, dim=-1)
            return self.down(up * F.silu(gate))
        if k == "ungated":
            return self.down(F.gelu(self.up(x)))
        act = {"silu_gated": F.silu, "gelu_gated": F.gelu,
               "gelu_tanh_gated": lambda h: F.gelu(h, approximate="tanh")}[k]
        return self.down(act(self.gate(x)) * self.up(x))


class Block(nn.Module):
    def __init__(self, s: Spelling, z: Sizes) -> None:
        super().__init__()
        self.norm1, self.attn, self.norm2, self.mlp = Norm(s, z), Attention(s, z), Norm(s, z), MLP(s, z)

    def forward(self, x, pos, cos, sin, k_cache, v_cache, mask):
        x = x + self.attn(self.norm1(x), pos, cos, sin, k_cache, v_cache, mask)
        return x + self.mlp(self.norm2(x))


class CoverageDecoder(nn.Module):
    """One token per call over a static cache: forward(token [1, 1], pos [1], *caches) -> logits [1, 1, vocab]."""

    def __init__(self, s: Spelling, z: Sizes = Sizes()) -> None:
        super().__init__()
        self.s, self.z = s, z
        self.embed = nn.Embedding(z.vocab, z.hidden)
        self.blocks = nn.ModuleList(Block(s, z) for _ in range(z.layers))
        self.norm = Norm(s, z)
        self.head = nn.Linear(z.hidden, z.vocab, bias=False)
        inv = 1.0 / (10000.0 ** (torch.arange(0, z.head_dim, 2).float() / z.head_dim))
        freqs = torch.outer(torch.arange(z.max_positions).float(), inv)
        emb = torch.cat((freqs, freqs), dim=-1)
        if s.rotary == "interleaved":
            emb = freqs.repeat_interleave(2, dim=-1)
        self.register_buffer("angles", freqs, persistent=False)  # per pair: rotary=complex's freqs_cis = e^(i angle)
        self.register_buffer("cos", emb.cos(), persistent=False)
        self.register_buffer("sin", emb.sin(), persistent=False)
        self.register_buffer("positions", torch.arange(z.max_positions), persistent=False)

    def new_cache(self) -> list[torch.Tensor]:
        kv = self.z.heads if self.s.gqa == "none" else self.z.kv_heads
        dtype = getattr(torch, self.s.dtype)
        return [torch.zeros(1, kv, self.z.max_positions, self.z.head_dim, dtype=dtype)
                for _ in range(2 * self.z.layers)]

    def forward(self, token: torch.Tensor, pos: torch.Tensor, *caches: torch.Tensor) -> torch.Tensor:
        x = self.embed(token)
        cos = self.cos[pos].to(x.dtype)[None, None]
        sin = self.sin[pos].to(x.dtype)[None, None]
        if self.s.rotary == "complex":  # freqs_cis from the angles (a complex buffer would not survive .to(bfloat16))
            angles = self.angles[pos].float()
            cos = torch.polar(torch.ones_like(angles), angles)[None, None]
        visible = self.positions <= pos  # [max_positions]
        if self.s.mask == "bool":
            mask = visible.view(1, 1, 1, -1)
        elif self.s.mask == "additive":
            mask = torch.zeros(1, 1, 1, self.z.max_positions, dtype=x.dtype).masked_fill(~visible, float("-inf"))
        else:
            mask = None
        for i, block in enumerate(self.blocks):
            x = block(x, pos, cos, sin, caches[2 * i], caches[2 * i + 1], mask)
        return self.head(self.norm(x))


def build(s: Spelling, z: Sizes = Sizes(), seed: int = 0) -> CoverageDecoder:
    torch.manual_seed(seed)
    return CoverageDecoder(s, z).to(getattr(torch, s.dtype)).eval()


def decode(model: nn.Module, step, steps: int, first_token: int = 3) -> Iterator[torch.Tensor]:
    """Greedy decoding with `step` (the model or a compiled one): yields each step's logits."""
    caches = model.new_cache()
    token = torch.tensor([[first_token]])
    for i in range(steps):
        logits = step(token, torch.tensor([i]), *caches)
        yield logits
        token = logits[:, -1:].float().argmax(-1)
