"""Mistake: a torch.library.custom_op with no register_fake (graphex check: check 1, fake proposed)."""

import torch


@torch.library.custom_op("chk_mf_co::row_norm", mutates_args=(), device_types="cpu")
def row_norm(x: torch.Tensor) -> torch.Tensor:
    return (x * x).sum(-1).sqrt()


if __name__ == "__main__":
    print(row_norm(torch.randn(4, 8)).shape)
    print(row_norm(torch.randn(2, 3, 5)).shape)
