"""Tensor-parallel version of the shipped decoder (examples/models/decoder.py), Megatron style.

Each rank of a process group holds a slice of every layer, cut from the full model so that
the sharded model computes what the single-process one does:

- attention: q/k/v are column-parallel (rank r owns heads r*H/W .. (r+1)*H/W - 1), o_proj is
  row-parallel (the matching input columns) and its partial sums are added with all_reduce;
- MLP: gate/up are column-parallel (a slice of the intermediate size), down is row-parallel
  with all_reduce;
- the KV cache is sharded by heads: [layers, B, heads / W, max_positions, head_dim] per rank;
- the head is vocab-parallel: each rank computes the logits of its slice of the vocabulary and
  all_gather_into_tensor assembles the full logits on every rank.

Embedding and norms are replicated. The collectives are the c10d calls user code writes
(`dist.all_reduce(t)`, `dist.all_gather_into_tensor(out, t)`); Dynamo turns them into
functional collectives + wait_tensor, which graphex replays from C++ like any other op.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
from torch import nn

from .decoder import Decoder, RMSNorm, apply_rotary


# torch 2.13 renamed all_gather_into_tensor to all_gather_single (the old name warns); Dynamo traces both.
_all_gather_into_tensor = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def _linear(weight: torch.Tensor) -> nn.Linear:
    out_features, in_features = weight.shape
    layer = nn.Linear(in_features, out_features, bias=False)
    layer.weight = nn.Parameter(weight.detach().clone().contiguous(), requires_grad=False)
    return layer


def _norm(norm: RMSNorm) -> RMSNorm:
    copy = RMSNorm(norm.weight.shape[0], norm.eps, norm.custom_ops)
    copy.weight = nn.Parameter(norm.weight.detach().clone(), requires_grad=False)
    return copy


class TPAttention(nn.Module):
    def __init__(self, full: nn.Module, rank: int, world: int, group: dist.ProcessGroup | None) -> None:
        super().__init__()
        cfg = full.cfg
        if cfg.heads % world:
            raise ValueError(f"{cfg.heads} heads cannot be split over {world} ranks")
        self.cfg, self.group = cfg, group
        self.heads = cfg.heads // world
        cols = slice(rank * self.heads * cfg.head_dim, (rank + 1) * self.heads * cfg.head_dim)
        self.q_proj = _linear(full.q_proj.weight[cols])   # column-parallel: this rank's heads
        self.k_proj = _linear(full.k_proj.weight[cols])
        self.v_proj = _linear(full.v_proj.weight[cols])
        self.o_proj = _linear(full.o_proj.weight[:, cols])  # row-parallel: the same heads' inputs

    def forward(self, x, cos, sin, pos, mask, k_cache, v_cache):
        b, t, _ = x.shape
        h, d = self.heads, self.cfg.head_dim
        q = apply_rotary(self.q_proj(x).view(b, t, h, d).transpose(1, 2), cos, sin)
        k = apply_rotary(self.k_proj(x).view(b, t, h, d).transpose(1, 2), cos, sin)
        v = self.v_proj(x).view(b, t, h, d).transpose(1, 2)
        k_cache.index_copy_(2, pos, k)  # this rank's heads of the cache, in place
        v_cache.index_copy_(2, pos, v)
        scores = torch.matmul(q, k_cache.transpose(2, 3)) / math.sqrt(d)
        scores = scores.masked_fill(~mask, float("-inf"))
        probs = torch.softmax(scores.float(), dim=-1).to(q.dtype)
        out = self.o_proj(torch.matmul(probs, v_cache).transpose(1, 2).reshape(b, t, h * d))
        dist.all_reduce(out, group=self.group)  # sum of every rank's heads
        return out


class TPMLP(nn.Module):
    def __init__(self, full: nn.Module, rank: int, world: int, group: dist.ProcessGroup | None) -> None:
        super().__init__()
        inter = full.gate.weight.shape[0]
        if inter % world:
            raise ValueError(f"intermediate size {inter} cannot be split over {world} ranks")
        cols = slice(rank * inter // world, (rank + 1) * inter // world)
        self.group = group
        self.gate = _linear(full.gate.weight[cols])
        self.up = _linear(full.up.weight[cols])
        self.down = _linear(full.down.weight[:, cols])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.down(nn.functional.silu(self.gate(x)) * self.up(x))
        dist.all_reduce(out, group=self.group)
        return out


class TPDecoderLayer(nn.Module):
    def __init__(self, full: nn.Module, rank: int, world: int, group: dist.ProcessGroup | None) -> None:
        super().__init__()
        self.attn_norm = _norm(full.attn_norm)
        self.attn = TPAttention(full.attn, rank, world, group)
        self.mlp_norm = _norm(full.mlp_norm)
        self.mlp = TPMLP(full.mlp, rank, world, group)

    def forward(self, x, cos, sin, pos, mask, k_cache, v_cache):
        x = x + self.attn(self.attn_norm(x), cos, sin, pos, mask, k_cache, v_cache)
        return x + self.mlp(self.mlp_norm(x))


class TPDecoder(nn.Module):
    """This rank's shard of `full`: the same forward(tokens, pos, k_cache, v_cache) -> logits [B, 1, vocab],
    with this rank's heads of the KV cache (see new_cache)."""

    def __init__(self, full: Decoder, group: dist.ProcessGroup | None = None) -> None:
        super().__init__()
        if full.cfg.custom_ops:
            raise ValueError("the tensor-parallel decoder is written in plain PyTorch (custom_ops=False)")
        self.cfg, self.group = full.cfg, group
        self.rank, self.world = dist.get_rank(group), dist.get_world_size(group)
        vocab = full.cfg.vocab_size
        if vocab % self.world:
            raise ValueError(f"vocabulary {vocab} cannot be split over {self.world} ranks")
        self.embed = nn.Embedding.from_pretrained(full.embed.weight.detach().clone(), freeze=True)
        self.layers = nn.ModuleList(TPDecoderLayer(layer, self.rank, self.world, group) for layer in full.layers)
        self.norm = _norm(full.norm)
        rows = slice(self.rank * vocab // self.world, (self.rank + 1) * vocab // self.world)
        self.lm_head = _linear(full.lm_head.weight[rows])  # vocab-parallel
        for name in ("cos_table", "sin_table", "positions"):
            self.register_buffer(name, getattr(full, name).clone(), persistent=False)
        self.eval()

    def forward(self, tokens: torch.Tensor, pos: torch.Tensor, k_cache: torch.Tensor,
                v_cache: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        cos = self.cos_table.index_select(0, pos)[None, None]
        sin = self.sin_table.index_select(0, pos)[None, None]
        mask = (self.positions <= pos)[None, None, None, :]
        for i, layer in enumerate(self.layers):
            x = layer(x, cos, sin, pos, mask, k_cache[i], v_cache[i])
        local = self.lm_head(self.norm(x))  # [B, T, vocab / W]
        b, t, v = local.shape
        gathered = torch.empty(self.world * b * t, v, dtype=local.dtype)
        _all_gather_into_tensor(gathered, local.reshape(b * t, v), group=self.group)
        return gathered.view(self.world, b, t, v).permute(1, 2, 0, 3).reshape(b, t, self.world * v)

    def new_cache(self, batch: int = 1, dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
        cfg = self.cfg
        shape = (cfg.layers, batch, cfg.heads // self.world, cfg.max_positions, cfg.head_dim)
        return torch.zeros(shape, dtype=dtype), torch.zeros(shape, dtype=dtype)
