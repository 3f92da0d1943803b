"""Meta (fake) functions registered from Python for ops defined in C++ (the op-plugin style).

scale_rows and scale_rows_ are defined and implemented in example_ops.cpp, which
deliberately registers no Meta kernel for them; this module provides it, as the
npugraph_ex template does for torch_npu ops. It must run before torch.compile.
"""

from __future__ import annotations

import torch

_meta_lib = torch.library.Library("graphex_examples", "IMPL", "Meta")


@torch.library.impl(_meta_lib, "scale_rows")
def scale_rows_meta(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


@torch.library.impl(_meta_lib, "scale_rows_")
def scale_rows__meta(x: torch.Tensor, scale: torch.Tensor) -> None:
    return None  # in-place: x keeps its shape; nothing is returned
