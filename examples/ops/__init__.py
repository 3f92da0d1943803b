"""The example operator library (C++), built by the project's CMake (`make build`).

    from examples import ops
    ops.load()                     # loads libgraphex_example_ops.so and the Python Meta functions
    torch.ops.graphex_examples.rms_norm(x, w, 1e-6)
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

LIBRARY = "libgraphex_example_ops.so"
_loaded = False


def library_path() -> Path:
    """Where `make build` put the library: installed next to graphex._C, or in the build tree."""
    from graphex.base.libraries import built_library

    return built_library("_examples", LIBRARY, "run `make build`")


def load() -> None:
    """Register the graphex_examples operators in this process (idempotent)."""
    global _loaded
    if _loaded:
        return
    torch.ops.load_library(os.fspath(library_path()))
    from . import meta  # noqa: F401  (Python Meta functions for scale_rows / scale_rows_)

    _loaded = True
