"""Mistake: kernels that write an input their registration does not declare (check 3).

update_and_scale (torch.library.Library) updates `state` in place, but its schema has no (a!);
clamp_and_sum (custom_op) clamps `x` in place with mutates_args=().
"""

import torch

lib = torch.library.Library("chk_mut", "FRAGMENT")
lib.define("update_and_scale(Tensor x, Tensor state, float momentum) -> Tensor")
meta_lib = torch.library.Library("chk_mut", "IMPL", "Meta")


@torch.library.impl(lib, "update_and_scale", "CPU")
def update_and_scale(x, state, momentum):
    state.mul_(momentum).add_(x.mean(0), alpha=1 - momentum)  # writes `state`
    return x * 2


@torch.library.impl(meta_lib, "update_and_scale")
def update_and_scale_meta(x, state, momentum):
    return torch.empty_like(x)


@torch.library.custom_op("chk_mut::clamp_and_sum", mutates_args=(), device_types="cpu")
def clamp_and_sum(x: torch.Tensor) -> torch.Tensor:
    x.clamp_(min=0)  # writes `x`
    return x.sum(0)


@clamp_and_sum.register_fake
def _(x):
    return x.new_empty(x.shape[1:])


if __name__ == "__main__":
    state = torch.zeros(4)
    for _ in range(2):
        y = torch.ops.chk_mut.update_and_scale(torch.randn(8, 4), state, 0.9)
    print(y.shape, state)
    print(clamp_and_sum(torch.randn(3, 4)))
