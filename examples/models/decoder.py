"""A small Llama-style decoder for decode steps with a static, in-place KV cache.

RMSNorm, rotary position embeddings, multi-head attention over a preallocated
KV cache that each step updates in place (`index_copy_` at the current position),
and a SiLU-gated MLP. Shapes never change between steps (the position is a
tensor, the cache has a fixed length and a mask hides the unwritten part), so
`torch.compile(..., dynamic=False)` captures one graph for the whole decode loop.
"""

from __future__ import annotations

import dataclasses
import math

import torch
from torch import nn


@dataclasses.dataclass(frozen=True)
class DecoderConfig:
    vocab_size: int = 512
    hidden: int = 256
    heads: int = 4
    layers: int = 4
    intermediate: int = 688
    max_positions: int = 256
    eps: float = 1e-6
    rope_theta: float = 10000.0
    # Use the C++ example operators (examples/ops) for RMSNorm, rotary embeddings and the
    # KV-cache update instead of plain PyTorch; results are bit-identical either way.
    custom_ops: bool = False

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float, custom_ops: bool = False) -> None:
        super().__init__()
        self.eps = eps
        self.custom_ops = custom_ops
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.custom_ops:
            return torch.ops.graphex_examples.rms_norm(x, self.weight, self.eps)
        variance = x.pow(2).mean(-1, keepdim=True)
        return x * torch.rsqrt(variance + self.eps) * self.weight


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    return x * cos + rotate_half(x) * sin


class Attention(nn.Module):
    def __init__(self, cfg: DecoderConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.q_proj = nn.Linear(cfg.hidden, cfg.hidden, bias=False)
        self.k_proj = nn.Linear(cfg.hidden, cfg.hidden, bias=False)
        self.v_proj = nn.Linear(cfg.hidden, cfg.hidden, bias=False)
        self.o_proj = nn.Linear(cfg.hidden, cfg.hidden, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, pos: torch.Tensor,
                mask: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        h, d = self.cfg.heads, self.cfg.head_dim
        q = self.q_proj(x).view(b, t, h, d).transpose(1, 2)
        k = self.k_proj(x).view(b, t, h, d).transpose(1, 2)
        v = self.v_proj(x).view(b, t, h, d).transpose(1, 2)
        # The KV cache is updated in place: the caller's tensors hold the new entries.
        if self.cfg.custom_ops:
            q, k = torch.ops.graphex_examples.rotary_embedding(q, k, cos, sin)
            torch.ops.graphex_examples.kv_cache_update_(k_cache, v_cache, pos, k, v)
        else:
            q = apply_rotary(q, cos, sin)
            k = apply_rotary(k, cos, sin)
            k_cache.index_copy_(2, pos, k)
            v_cache.index_copy_(2, pos, v)
        scores = torch.matmul(q, k_cache.transpose(2, 3)) / math.sqrt(d)
        scores = scores.masked_fill(~mask, float("-inf"))
        probs = torch.softmax(scores.float(), dim=-1).to(q.dtype)
        out = torch.matmul(probs, v_cache)
        return self.o_proj(out.transpose(1, 2).reshape(b, t, h * d))


class MLP(nn.Module):
    def __init__(self, cfg: DecoderConfig) -> None:
        super().__init__()
        self.gate = nn.Linear(cfg.hidden, cfg.intermediate, bias=False)
        self.up = nn.Linear(cfg.hidden, cfg.intermediate, bias=False)
        self.down = nn.Linear(cfg.intermediate, cfg.hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(nn.functional.silu(self.gate(x)) * self.up(x))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: DecoderConfig) -> None:
        super().__init__()
        self.attn_norm = RMSNorm(cfg.hidden, cfg.eps, cfg.custom_ops)
        self.attn = Attention(cfg)
        self.mlp_norm = RMSNorm(cfg.hidden, cfg.eps, cfg.custom_ops)
        self.mlp = MLP(cfg)

    def forward(self, x, cos, sin, pos, mask, k_cache, v_cache):
        x = x + self.attn(self.attn_norm(x), cos, sin, pos, mask, k_cache, v_cache)
        return x + self.mlp(self.mlp_norm(x))


class Decoder(nn.Module):
    """forward(tokens [B, 1] int64, pos [1] int64, k_cache, v_cache) -> logits [B, 1, vocab].

    k_cache / v_cache: [layers, B, heads, max_positions, head_dim], written in place at `pos`.
    """

    def __init__(self, cfg: DecoderConfig = DecoderConfig()) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden)
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.layers))
        self.norm = RMSNorm(cfg.hidden, cfg.eps, cfg.custom_ops)
        self.lm_head = nn.Linear(cfg.hidden, cfg.vocab_size, bias=False)
        inv_freq = 1.0 / (cfg.rope_theta ** (torch.arange(0, cfg.head_dim, 2).float() / cfg.head_dim))
        angles = torch.outer(torch.arange(cfg.max_positions).float(), inv_freq)
        emb = torch.cat((angles, angles), dim=-1)
        self.register_buffer("cos_table", emb.cos(), persistent=False)
        self.register_buffer("sin_table", emb.sin(), persistent=False)
        self.register_buffer("positions", torch.arange(cfg.max_positions), persistent=False)

    def forward(self, tokens: torch.Tensor, pos: torch.Tensor, k_cache: torch.Tensor,
                v_cache: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        cos = self.cos_table.index_select(0, pos)[None, None]  # [1, 1, 1, head_dim]
        sin = self.sin_table.index_select(0, pos)[None, None]
        mask = (self.positions <= pos)[None, None, None, :]   # attend to written positions only
        for i, layer in enumerate(self.layers):
            x = layer(x, cos, sin, pos, mask, k_cache[i], v_cache[i])
        return self.lm_head(self.norm(x))

    def new_cache(self, batch: int = 1, dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
        cfg = self.cfg
        shape = (cfg.layers, batch, cfg.heads, cfg.max_positions, cfg.head_dim)
        return torch.zeros(shape, dtype=dtype), torch.zeros(shape, dtype=dtype)


def build_decoder(cfg: DecoderConfig = DecoderConfig(), seed: int = 0) -> Decoder:
    """The shipped model: deterministic weights from `seed`, eval mode, no grad needed."""
    if cfg.custom_ops:
        from examples import ops

        ops.load()
    torch.manual_seed(seed)
    model = Decoder(cfg).eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model


def decode(model: torch.nn.Module, steps: int, *, prompt_token: int = 1, batch: int = 1,
           cache: tuple[torch.Tensor, torch.Tensor] | None = None, on_step=None) -> list[torch.Tensor]:
    """Greedy decode loop: returns the logits of every step. `on_step(step, logits, k, v)` is called after each."""
    base = model._orig_mod if hasattr(model, "_orig_mod") else model
    k_cache, v_cache = cache if cache is not None else base.new_cache(batch)
    tokens = torch.full((batch, 1), prompt_token, dtype=torch.long)
    outputs = []
    for step in range(steps):
        pos = torch.tensor([step], dtype=torch.long)
        logits = model(tokens, pos, k_cache, v_cache)
        outputs.append(logits)
        if on_step is not None:
            on_step(step, logits, k_cache, v_cache)
        tokens = logits[:, -1].argmax(-1, keepdim=True)
    return outputs
