"""Mistake: mutates_args declares an input the kernel never writes (check 3)."""

import torch


@torch.library.custom_op("chk_decl::scaled", mutates_args=("x",), device_types="cpu")
def scaled(x: torch.Tensor, s: float) -> torch.Tensor:
    return x * s  # reads x, never writes it


@scaled.register_fake
def _(x, s):
    return torch.empty_like(x)


if __name__ == "__main__":
    print(scaled(torch.randn(3), 2.0))
