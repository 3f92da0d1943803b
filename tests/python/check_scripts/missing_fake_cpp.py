"""Mistake: a C++ op (TORCH_LIBRARY) with no Meta kernel: graphex_examples::needs_meta (check 1)."""

import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", ".."))
from examples import ops  # noqa: E402

ops.load()

if __name__ == "__main__":
    print(torch.ops.graphex_examples.needs_meta(torch.randn(3, 5)).shape)
