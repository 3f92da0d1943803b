"""Mistake: the Meta function returns the input's dtype, the kernel returns int64 (check 2).

Also a C++ op with a wrong Meta from Python (the op-plugin style): graphex_examples::needs_meta
has no Meta in C++; this script registers one with the wrong dtype.
"""

import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", ".."))
from examples import ops  # noqa: E402

ops.load()

lib = torch.library.Library("chk_dtype", "FRAGMENT")
lib.define("argmax_last(Tensor x) -> Tensor")
meta_lib = torch.library.Library("chk_dtype", "IMPL", "Meta")


@torch.library.impl(lib, "argmax_last", "CPU")
def argmax_last(x):
    return x.argmax(-1)


@torch.library.impl(meta_lib, "argmax_last")
def argmax_last_meta(x):
    return x.new_empty(x.shape[:-1])  # wrong: the kernel returns int64


example_meta = torch.library.Library("graphex_examples", "IMPL", "Meta")


@torch.library.impl(example_meta, "needs_meta")
def needs_meta_meta(x):
    return torch.empty_like(x, dtype=torch.float16)  # wrong: the kernel keeps x's dtype


if __name__ == "__main__":
    print(torch.ops.chk_dtype.argmax_last(torch.randn(4, 6)))
    print(torch.ops.graphex_examples.needs_meta(torch.randn(2, 3)).dtype)
