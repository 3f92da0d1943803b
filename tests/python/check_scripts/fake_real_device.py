"""Mistake: the Meta function allocates a real (cpu) tensor instead of one like its inputs (check 2)."""

import torch

lib = torch.library.Library("chk_dev", "FRAGMENT")
lib.define("double_it(Tensor x) -> Tensor")
meta_lib = torch.library.Library("chk_dev", "IMPL", "Meta")


@torch.library.impl(lib, "double_it", "CPU")
def double_it(x):
    return x * 2


@torch.library.impl(meta_lib, "double_it")
def double_it_meta(x):
    return torch.empty(x.shape)  # wrong: a cpu tensor; use torch.empty_like(x)


if __name__ == "__main__":
    print(torch.ops.chk_dev.double_it(torch.randn(3, 4)).shape)
