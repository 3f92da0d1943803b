"""Mistake: the fake returns the input's shape, the kernel reduces a dim (check 2, corrected fake proposed)."""

import torch


@torch.library.custom_op("chk_shape::sum_rows", mutates_args=(), device_types="cpu")
def sum_rows(x: torch.Tensor) -> torch.Tensor:
    return x.sum(1)


@sum_rows.register_fake
def _(x):
    return torch.empty_like(x)  # wrong: the kernel returns x.shape[:1]


if __name__ == "__main__":
    print(sum_rows(torch.randn(5, 7)).shape)
