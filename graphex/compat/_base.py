"""The torch version graphex runs on, and the error for an internal that changed shape."""

from __future__ import annotations

import torch


TORCH_VERSION: tuple[int, int] = tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2])  # type: ignore[assignment]
SUPPORTED = ((2, 11), (2, 15))  # inclusive; pyproject.toml says the same


class TorchInternalChanged(RuntimeError):
    """A torch internal graphex wraps no longer has the shape graphex expects; the message names it and the version."""
