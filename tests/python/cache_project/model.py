"""A small project for the compile-cache tests: a module whose code spans several files."""

import torch

import graphex
import ops  # noqa: F401  (registers cachetest::shift)
from config import SCALE
from helpers import double


class Block(torch.nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(dim, dim)
        self.eps = eps

    def forward(self, x):
        return torch.ops.cachetest.shift(self.lin(x), self.eps)


class Model(torch.nn.Module):
    def __init__(self, dim: int = 8, blocks: int = 2, eps: float = 1e-5, cache_dir: str = "", options=None) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList(Block(dim, eps) for _ in range(blocks))
        self.cached_forward = graphex.inference.cache_compile(self._forward, dynamic=False, cache_dir=cache_dir,
                                                              options=options)

    def forward(self, x):
        return self.cached_forward(x)

    def _forward(self, x):
        for block in self.blocks:
            x = block(x)
        return double(x) * SCALE
