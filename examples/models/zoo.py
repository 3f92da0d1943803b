"""Small models used by the tests, the demo and the benchmarks (each compared against eager)."""

from __future__ import annotations

import torch
from torch import nn


class MLP(nn.Module):
    """LayerNorm, GELU and residual connections."""

    def __init__(self, dim: int = 64, hidden: int = 256, blocks: int = 3) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(
            nn.ModuleDict({"norm": nn.LayerNorm(dim), "up": nn.Linear(dim, hidden), "down": nn.Linear(hidden, dim)})
            for _ in range(blocks))
        self.head = nn.Linear(dim, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for b in self.blocks:
            x = x + b["down"](nn.functional.gelu(b["up"](b["norm"](x))))
        return self.head(x)


class SmallCNN(nn.Module):
    """Convolution, batch norm (eval), ReLU, pooling, linear."""

    def __init__(self, classes: int = 10) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.AdaptiveAvgPool2d(1))
        self.classifier = nn.Linear(32, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.flatten(self.features(x), 1))


class ReturnsViews(nn.Module):
    """Returns views of its input next to a computed tensor."""

    def forward(self, x: torch.Tensor):
        return x.view(-1), x.transpose(0, 1), x[:, 1:], x.sum(0)


class SeveralOutputs(nn.Module):
    """Returns several tensors and an int."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor):
        h = self.proj(x)
        top = h.topk(3, dim=-1)
        return h.relu(), top.values, top.indices, x.shape[0] * 2


def init_batchnorm_stats(model: nn.Module, seed: int = 0) -> nn.Module:
    """Give batch norms non-trivial running statistics, so eval mode is really exercised."""
    g = torch.Generator().manual_seed(seed)
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.copy_(torch.randn(m.num_features, generator=g) * 0.1)
            m.running_var.copy_(torch.rand(m.num_features, generator=g) + 0.5)
    return model
