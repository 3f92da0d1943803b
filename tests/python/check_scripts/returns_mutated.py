"""Mistake: an in-place op that returns the input it mutates, `-> Tensor(a!)` (check 4)."""

import torch

lib = torch.library.Library("chk_retmut", "FRAGMENT")
lib.define("add_(Tensor(a!) x, Tensor y) -> Tensor(a!)")
meta_lib = torch.library.Library("chk_retmut", "IMPL", "Meta")


@torch.library.impl(lib, "add_", "CPU")
def add_(x, y):
    x.add_(y)
    return x


@torch.library.impl(meta_lib, "add_")
def add__meta(x, y):
    return x


if __name__ == "__main__":
    x = torch.zeros(3)
    torch.ops.chk_retmut.add_(x, torch.ones(3))
    print(x)
