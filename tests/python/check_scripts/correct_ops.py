"""Correct ops in all three registration styles: graphex check must pass (exit 0).

custom_op out of place and in place; torch.library.Library with the template schema, a
multi-output op and an in-place op; the C++ example ops (examples/ops).
"""

import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", ".."))
from examples import ops  # noqa: E402

ops.load()
ex = torch.ops.graphex_examples


# -- torch.library.custom_op ---------------------------------------------------------------------
@torch.library.custom_op("chk_ok::gelu_scale", mutates_args=(), device_types="cpu")
def gelu_scale(x: torch.Tensor, s: float) -> torch.Tensor:
    return torch.nn.functional.gelu(x) * s


@gelu_scale.register_fake
def _(x, s):
    return torch.empty_like(x)


@torch.library.custom_op("chk_ok::scale_", mutates_args=("x",), device_types="cpu")
def scale_(x: torch.Tensor, s: float) -> None:
    x.mul_(s)


@scale_.register_fake
def _(x, s):
    return None


# -- torch.library.Library -----------------------------------------------------------------------
lib = torch.library.Library("chk_ok", "FRAGMENT")
lib.define("my_op(Tensor x, Tensor? y, Tensor[] z, float attr1, int attr2) -> Tensor")
lib.define("stats(Tensor x) -> (Tensor, Tensor)")
lib.define("add_into_(Tensor(a!) acc, Tensor x) -> ()")
meta_lib = torch.library.Library("chk_ok", "IMPL", "Meta")


@torch.library.impl(lib, "my_op", "CPU")
def my_op(x, y, z, attr1, attr2):
    out = x * attr1 + attr2
    if y is not None:
        out = out + y
    for t in z:
        out = out * t
    return out


@torch.library.impl(lib, "stats", "CPU")
def stats(x):
    return x.mean(-1), x.var(-1)


@torch.library.impl(lib, "add_into_", "CPU")
def add_into_(acc, x):
    acc.add_(x)


@torch.library.impl(meta_lib, "my_op")
def my_op_meta(x, y, z, attr1, attr2):
    return torch.empty_like(x)


@torch.library.impl(meta_lib, "stats")
def stats_meta(x):
    return x.new_empty(x.shape[:-1]), x.new_empty(x.shape[:-1])


@torch.library.impl(meta_lib, "add_into_")
def add_into__meta(acc, x):
    return None


def main():
    x = torch.randn(4, 8)
    y = gelu_scale(x, 0.5)
    scale_(y, 2.0)
    out = torch.ops.chk_ok.my_op(x, y, [x, y], 1.5, 2)
    out = torch.ops.chk_ok.my_op(out, None, [], 0.5, 1)
    mean, var = torch.ops.chk_ok.stats(out)
    acc = torch.zeros(4)
    torch.ops.chk_ok.add_into_(acc, mean)

    # the C++ example ops
    h = ex.rms_norm(torch.randn(2, 3, 8), torch.ones(8), 1e-6)
    q, k = ex.rotary_embedding(torch.randn(1, 2, 3, 8), torch.randn(1, 2, 3, 8), torch.randn(3, 8), torch.randn(3, 8))
    k_cache, v_cache = torch.zeros(1, 2, 6, 8), torch.zeros(1, 2, 6, 8)
    ex.kv_cache_update_(k_cache, v_cache, torch.tensor([0, 1, 2]), k, torch.randn(1, 2, 3, 8))
    s = ex.scale_rows(torch.randn(3, 5), torch.randn(3))
    ex.scale_rows_(s, torch.randn(3))
    return acc, var, h, q, k_cache, v_cache, s


if __name__ == "__main__":
    for t in main():
        print(tuple(t.shape))
