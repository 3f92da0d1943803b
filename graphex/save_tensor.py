"""`graphex.save_tensor(t, path)`: a print-like dump that survives replay (npugraph_ex's
`torch_npu.save_npugraph_tensor`).

Note [save_tensor is an effectful op]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
A plain Python call inside a compiled function runs once, at trace time. save_tensor is a
custom operator (graphex::save_tensor) so it is captured into the graph and the engine calls
it on every replay. It returns nothing, so dead-code elimination would drop it: it is
registered as an ORDERED effectful op (graphex/compat/library.py), which makes AOTAutograd wrap it in
`with_effects` with a token; the engine replays those in program order (graphex/lowering/lower.py).
Each call replaces the file atomically (graphex/base/atomic.py): the file holds the last replay's value.
"""

from __future__ import annotations

import io
import os

import torch

from . import compat
from . import _C  # noqa: F401  (registers graphex::save_tensor)
from .base.atomic import write_atomic


@torch.library.custom_op("graphex::save_tensor", mutates_args=())
def _save_tensor_op(t: torch.Tensor, path: str) -> None:
    buffer = io.BytesIO()
    torch.save(t.detach().clone(), buffer)  # clone: a view would save its whole storage
    directory = os.path.dirname(path)
    if directory:
        os.makedirs(directory, exist_ok=True)
    write_atomic(path, buffer.getvalue())


@_save_tensor_op.register_fake
def _(t: torch.Tensor, path: str) -> None:
    return None


compat.register_ordered_effect(torch.ops.graphex.save_tensor.default)


def save_tensor(t: torch.Tensor, path: str | os.PathLike[str]) -> None:
    """Write `t` to `path` (torch.save format) now and, inside a compiled function, on every replay.

    Load it with `torch.load(path)`. The file is replaced whole each time: it holds the latest value.
    """
    torch.ops.graphex.save_tensor(t, os.fspath(path))
