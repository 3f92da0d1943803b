"""Mistake: the fake reads tensor data (.item()) to compute the output shape (check 5)."""

import torch


@torch.library.custom_op("chk_data::first_n", mutates_args=(), device_types="cpu")
def first_n(x: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
    return x[: int(n.item())].clone()


@first_n.register_fake
def _(x, n):
    return x.new_empty((int(n.item()), *x.shape[1:]))  # fakes have no data: .item() cannot work


if __name__ == "__main__":
    print(first_n(torch.randn(6, 2), torch.tensor(4)).shape)
