import torch


@torch.library.custom_op("cachetest::shift", mutates_args=())
def shift(x: torch.Tensor, s: float) -> torch.Tensor:
    return x + s


@shift.register_fake
def _(x, s):
    return torch.empty_like(x)
