"""The custom operators fuzzed programs call (`torch.ops.graphex_fuzz.*`): one out-of-place, one in place."""

from __future__ import annotations

import torch


@torch.library.custom_op("graphex_fuzz::scale", mutates_args=(), device_types="cpu")
def scale(x: torch.Tensor, k: int) -> torch.Tensor:
    return (x * k).contiguous()


@scale.register_fake
def _(x: torch.Tensor, k: int) -> torch.Tensor:
    return torch.empty_like(x, memory_format=torch.contiguous_format)


@torch.library.custom_op("graphex_fuzz::add_one_", mutates_args=("x",), device_types="cpu")
def add_one_(x: torch.Tensor) -> None:
    x.add_(1)


@add_one_.register_fake
def _(x: torch.Tensor) -> None:
    return None
