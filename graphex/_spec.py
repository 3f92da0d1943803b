"""Python twin of csrc/program/spec.h: encodes a program description to bytes.

See Note [One format for building, caching and deploying] in spec.h. Values:
None, bool, int, float, str, list/tuple, dict (str keys), Slot(i), Const(k),
and torch.Tensor (only for constant tables written to disk).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

import torch

MAGIC = b"GRAPHEX\x00"
FORMAT_VERSION = 1

_NONE, _FALSE, _TRUE, _INT, _FLOAT, _STR, _LIST, _DICT, _SLOT, _CONST, _TENSOR = range(11)


@dataclass(frozen=True)
class Slot:
    """A runtime value: the output of a node or a graph input."""

    index: int

    def __repr__(self) -> str:
        return f"%{self.index}"


@dataclass(frozen=True)
class Const:
    """A tensor in the program's constant table."""

    index: int

    def __repr__(self) -> str:
        return f"const{self.index}"


def encode(root: Any) -> bytes:
    out = bytearray(MAGIC)
    out += struct.pack("<I", FORMAT_VERSION)
    _encode_value(root, out)
    return bytes(out)


def _encode_value(v: Any, out: bytearray) -> None:
    if v is None:
        out.append(_NONE)
    elif v is True:
        out.append(_TRUE)
    elif v is False:
        out.append(_FALSE)
    elif isinstance(v, Slot):
        out.append(_SLOT)
        out += struct.pack("<I", v.index)
    elif isinstance(v, Const):
        out.append(_CONST)
        out += struct.pack("<I", v.index)
    elif isinstance(v, int):
        out.append(_INT)
        out += struct.pack("<q", v)
    elif isinstance(v, float):
        out.append(_FLOAT)
        out += struct.pack("<d", v)
    elif isinstance(v, str):
        b = v.encode("utf-8")
        out.append(_STR)
        out += struct.pack("<I", len(b))
        out += b
    elif isinstance(v, (list, tuple)):
        out.append(_LIST)
        out += struct.pack("<I", len(v))
        for item in v:
            _encode_value(item, out)
    elif isinstance(v, dict):
        out.append(_DICT)
        out += struct.pack("<I", len(v))
        for key in sorted(v):  # deterministic bytes: same program, same file
            b = key.encode("utf-8")
            out += struct.pack("<I", len(b))
            out += b
            _encode_value(v[key], out)
    elif isinstance(v, torch.Tensor):
        _encode_tensor(v, out)
    else:
        raise TypeError(f"graphex spec: cannot encode a {type(v).__name__}: {v!r}")


def _encode_tensor(t: torch.Tensor, out: bytearray) -> None:
    from . import _C

    t = t.detach().to("cpu").contiguous()
    out.append(_TENSOR)
    out += struct.pack("<iI", _C.dtype_code(t.dtype), t.dim())
    for s in t.shape:
        out += struct.pack("<q", s)
    data = bytes(t.reshape(-1).view(torch.uint8).tolist()) if t.numel() else b""
    out += struct.pack("<Q", len(data))
    out += data
