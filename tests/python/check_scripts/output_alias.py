"""Mistake: outputs that share memory with an input: `x` itself, or a view of it (check 4)."""

import torch

lib = torch.library.Library("chk_alias", "FRAGMENT")
lib.define("flat(Tensor x) -> Tensor")
lib.define("maybe_identity(Tensor x, bool apply) -> Tensor")
meta_lib = torch.library.Library("chk_alias", "IMPL", "Meta")


@torch.library.impl(lib, "flat", "CPU")
def flat(x):
    return x.view(-1)  # a view of x


@torch.library.impl(lib, "maybe_identity", "CPU")
def maybe_identity(x, apply):
    return x * 2 if apply else x  # x itself when apply is False


@torch.library.impl(meta_lib, "flat")
def flat_meta(x):
    return x.new_empty(x.numel())


@torch.library.impl(meta_lib, "maybe_identity")
def maybe_identity_meta(x, apply):
    return torch.empty_like(x)


if __name__ == "__main__":
    x = torch.randn(2, 3)
    print(torch.ops.chk_alias.flat(x).shape)
    print(torch.ops.chk_alias.maybe_identity(x, True).shape, torch.ops.chk_alias.maybe_identity(x, False).shape)
