"""Mistake: a torch.library.custom_op that returns a view of its input. torch refuses it even in eager,
so the script fails (exit 2); graphex check names the op and check 4, with the fix."""

import torch


@torch.library.custom_op("chk_coal::flatten", mutates_args=(), device_types="cpu")
def flatten(x: torch.Tensor) -> torch.Tensor:
    return x.view(-1)


@flatten.register_fake
def _(x):
    return x.new_empty(x.numel())


if __name__ == "__main__":
    print(flatten(torch.randn(2, 3)).shape)
