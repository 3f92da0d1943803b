"""graphex.export (this module is graphex.exporting): write what a C++ program loads (graphex::Module::load).

    graphex.export(model, (x,), "model.graphex")
    # model.graphex/program.gxp        the program (csrc/schema/program.fbs), bindings and result leaves
    # model.graphex/weights.safetensors parameters and buffers by fully qualified name

The capture is cache_compile's (one Dynamo trace, the graphex backend, the same checks), so
an export runs on exactly the program a cache entry would hold. Parameters and buffers are
bound by name (Note [An artifact binds its inputs by kind], csrc/deploy/module.h), never baked in.
"""

from __future__ import annotations

import json
import os
import struct
from typing import Any, Callable, Sequence

import torch
from torch.utils import _pytree as pytree

from ._atomic import write_atomic
from .errors import GraphexError, Finding
from .options import Options

PROGRAM_FILE = "program.gxp"
WEIGHTS_FILE = "weights.safetensors"

_SAFETENSORS_DTYPES = {torch.bool: "BOOL", torch.uint8: "U8", torch.int8: "I8", torch.int16: "I16",
                       torch.int32: "I32", torch.int64: "I64", torch.float16: "F16", torch.bfloat16: "BF16",
                       torch.float32: "F32", torch.float64: "F64"}


class ExportError(GraphexError):
    """The function cannot be exported; the finding says why and what to change."""


def export(model_or_fn: torch.nn.Module | Callable[..., Any], example_inputs: Sequence[Any], path: str | os.PathLike,
           *, dynamic: bool = False, options: dict[str, Any] | None = None) -> str:
    """Capture `model_or_fn(*example_inputs)` and write `path`/program.gxp and `path`/weights.safetensors.

    Returns the directory. Runs under torch.no_grad() (an artifact is inference only)."""
    from .inference.capture import compile_cold

    func = model_or_fn.forward if isinstance(model_or_fn, torch.nn.Module) else model_or_fn
    module = getattr(func, "__self__", None)
    flat, in_spec = pytree.tree_flatten((tuple(example_inputs), {}))
    with torch.no_grad():
        _, entry, why = compile_cold(func, flat, in_spec, Options.from_user(options), bool(dynamic), {})
    if entry is None:
        raise ExportError(finding=Finding(
            what=f"cannot export {getattr(func, '__qualname__', func)}: {why}", where="",
            fix="change what the message names; graphex.inference.cache_compile has the same limits"))
    weights: dict[str, torch.Tensor] = {}
    for b in entry.header["inputs"]:
        if b["kind"] in ("param", "buffer"):
            fqn = f"{b['owner']}.{b['name']}" if b["owner"] else b["name"]
            weights[fqn] = module.get_parameter(fqn) if b["kind"] == "param" else module.get_buffer(fqn)  # type: ignore[union-attr]
    os.makedirs(path, exist_ok=True)
    write_atomic(os.path.join(path, WEIGHTS_FILE), safetensors_bytes(weights), durable=True)
    write_atomic(os.path.join(path, PROGRAM_FILE), entry.program, durable=True)
    return os.fspath(path)


def safetensors_bytes(tensors: dict[str, torch.Tensor]) -> bytes:
    """The safetensors layout: u64 header length, JSON header, data (each tensor 8-byte aligned)."""
    header: dict[str, Any] = {}
    blobs, offset = [], 0
    for name in sorted(tensors):
        t = tensors[name].detach().to("cpu").contiguous()
        if t.dtype not in _SAFETENSORS_DTYPES:
            raise ExportError(f"weight {name} has dtype {t.dtype}, which safetensors cannot hold")
        data = t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
        pad = (-len(data)) % 8
        header[name] = {"dtype": _SAFETENSORS_DTYPES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data + b"\0" * pad)
        offset += len(data) + pad
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((-len(text)) % 8)
    return struct.pack("<Q", len(text)) + text + b"".join(blobs)


def load_safetensors(path: str | os.PathLike) -> dict[str, torch.Tensor]:
    """Read a safetensors file (e.g. graphex-run --output) into name -> tensor (copies)."""
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    dtypes = {v: k for k, v in _SAFETENSORS_DTYPES.items()}
    out = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        begin, end = (8 + n + o for o in entry["data_offsets"])
        raw = bytearray(data[begin:end])
        flat = torch.frombuffer(raw, dtype=dtypes[entry["dtype"]]) if raw else torch.empty(0, dtype=dtypes[entry["dtype"]])
        out[name] = flat.reshape(entry["shape"]).clone()
    return out
