"""Mistake: a torch.library.Library op with a CPU kernel and no Meta function (check 1, fake proposed)."""

import torch

lib = torch.library.Library("chk_mf_lib", "FRAGMENT")
lib.define("pairwise_add(Tensor x, Tensor y) -> Tensor")


@torch.library.impl(lib, "pairwise_add", "CPU")
def pairwise_add(x, y):
    return x + y


if __name__ == "__main__":
    out = torch.ops.chk_mf_lib.pairwise_add(torch.randn(4, 3), torch.randn(3))
    print(out.shape)
