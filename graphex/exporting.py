"""graphex.export (this module is graphex.exporting): write what a C++ program loads (graphex::Module::load).

    graphex.export(model, (x,), "model.graphex")
    # model.graphex/program.gxp        the program (csrc/schema/program.fbs), bindings and result leaves
    # model.graphex/weights.safetensors parameters and buffers by fully qualified name

The capture is cache_compile's (one Dynamo trace, the graphex backend, the same checks), so
an export runs on exactly the program a cache entry would hold. Parameters and buffers are
bound by name (Note [An artifact binds its inputs by kind], csrc/deploy/module.h), never baked in.

Note [An artifact holds no Python operator]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
A C++ process has every operator whose schema and kernels are compiled code (ATen, a
TORCH_LIBRARY library it loads or links), and none defined from Python
(torch.library.custom_op, Library.define/impl with a Python function). export refuses a
program that calls an operator whose schema or backend kernel (CPU, CUDA, Composite*) was
registered from a .py file, naming each such operator, the user line that called it and the fix,
instead of writing an artifact that graphex::Module::load would refuse (or run differently).
A Meta kernel from Python is fine: the runtime never calls it. aten operators are libtorch's
and are not checked.
"""

from __future__ import annotations

import json
import os
import struct
from typing import Any, Callable, Sequence

import torch
from torch.utils import _pytree as pytree

from .base.atomic import write_atomic
from .base.weights_layout import PAD_PREFIX, is_padding
from .distributed import is_collective
from .errors import GraphexError, Finding
from .options import Options

PROGRAM_FILE = "program.gxp"
WEIGHTS_FILE = "weights.safetensors"
# Where the data section and every tensor of a file safetensors_bytes writes start: Note [Weights are 64-byte
# aligned] (csrc/deploy/safetensors.h, whose kWeightsAlignment is the same number). MKL/oneDNN pick their code
# path by the operands' alignment and eager's weights come from c10's 64-aligned allocator, so a weight mapped
# from the file at another alignment can round differently from eager. The gaps this leaves between tensors are
# padding entries named with PAD_PREFIX (graphex/base/weights_layout.py), which readers skip.
WEIGHTS_ALIGNMENT = 64

_SAFETENSORS_DTYPES = {torch.bool: "BOOL", torch.uint8: "U8", torch.int8: "I8", torch.int16: "I16",
                       torch.int32: "I32", torch.int64: "I64", torch.float16: "F16", torch.bfloat16: "BF16",
                       torch.float32: "F32", torch.float64: "F64"}


class ExportError(GraphexError):
    """The function cannot be exported; the finding says why and what to change."""


def _unstorable_dtype(name: str, dtype: torch.dtype) -> Finding:
    stored = ", ".join(str(d).replace("torch.", "") for d in _SAFETENSORS_DTYPES)
    attr = name.rsplit(".", 1)[-1]
    if dtype.is_complex:  # Meta's Llama keeps its rotary table `freqs_cis` as a complex64 buffer
        fix = (f"keep the real and imaginary parts as a float buffer and make the complex view in forward:\n"
               f"    self.register_buffer({attr!r}, torch.view_as_real(table))   # in __init__: [..., 2] floats\n"
               f"    table = torch.view_as_complex(self.{attr})                  # in forward: the same complex values")
    else:
        fix = f"convert it (`.to(...)`) to a dtype safetensors holds: {stored}"
    return Finding(what=f"cannot write weight {name!r}: its dtype {dtype} is not one safetensors holds",
                   why=f"graphex's artifacts store weights as safetensors, whose dtypes are {stored}", fix=fix)


def export(model_or_fn: torch.nn.Module | Callable[..., Any], example_inputs: Sequence[Any], path: str | os.PathLike,
           *, dynamic: bool = False, options: dict[str, Any] | None = None) -> str:
    """Capture `model_or_fn(*example_inputs)` and write `path`/program.gxp and `path`/weights.safetensors.

    Returns the directory. Runs under torch.no_grad() (an artifact is inference only)."""
    from .inference.capture import compile_cold

    func = model_or_fn.forward if isinstance(model_or_fn, torch.nn.Module) else model_or_fn
    module = getattr(func, "__self__", None)
    flat, in_spec = pytree.tree_flatten((tuple(example_inputs), {}))
    with torch.no_grad():
        _, entry, why = compile_cold(func, flat, in_spec, Options.from_user(options), bool(dynamic), {},
                                   with_guards=False)
    if entry is None:
        raise ExportError(finding=Finding(
            what=f"cannot export {getattr(func, '__qualname__', func)}: {why}", where="",
            fix="change what the message names; graphex.inference.cache_compile has the same limits"))
    if entry.header.get("unexportable"):  # Note [An exported program checks its shape guards]
        raise ExportError(finding=Finding(
            what=f"cannot export {getattr(func, '__qualname__', func)} with dynamic=True: {entry.header['unexportable']}",
            where="", fix="export with dynamic=False (one artifact per shape), or keep this model on "
                          "graphex.inference.cache_compile, which checks such guards in Python"))
    bindings = entry.bindings
    held = [b.source for b in bindings if b.kind == "attr"]
    if held:  # Note [A tensor an argument holds is bound through its path]: graphex::Module takes tensors
        raise ExportError(finding=Finding(
            what=f"cannot export {getattr(func, '__qualname__', func)}: it reads tensors that an argument object "
                 f"holds ({', '.join(held[:3])}{', ...' if len(held) > 3 else ''}), and an artifact takes tensors",
            where="", fix="pass those tensors as arguments (e.g. the KV cache's key and value tensors), or keep this "
                          "call on graphex.inference.cache_compile, which binds them per call"))
    _refuse_python_operators(entry.program)
    _refuse_collectives(entry.program)
    weights: dict[str, torch.Tensor] = {}
    for b in bindings:
        if b.kind in ("param", "buffer"):
            weights[b.fqn] = module.get_parameter(b.fqn) if b.kind == "param" else module.get_buffer(b.fqn)  # type: ignore[union-attr]
    os.makedirs(path, exist_ok=True)
    write_atomic(os.path.join(path, WEIGHTS_FILE), safetensors_bytes(weights), durable=True)
    write_atomic(os.path.join(path, PROGRAM_FILE), entry.program, durable=True)
    return os.fspath(path)


_KERNEL_KEYS = ("CPU", "CUDA", "CompositeExplicitAutograd", "CompositeImplicitAutograd")


def program_operators(program: bytes) -> dict[str, str]:
    """The operators a program (program.gxp bytes) calls: "ns::name" or "ns::name.overload" -> the
    source line of its first call."""
    from .fb.NodeKind import NodeKind
    from .fb.Program import Program

    root = Program.GetRootAs(program, 4)  # size-prefixed (graphex/program/encode.py)
    ops: dict[str, str] = {}
    for j in range(root.NodesLength()):
        node = root.Nodes(j)
        if node.Kind() != NodeKind.Op:
            continue
        name, overload = (node.Op() or b"").decode(), (node.Overload() or b"").decode()
        qualified = name if overload in ("", "default") else f"{name}.{overload}"
        ops.setdefault(qualified, (node.Source() or b"").decode())
    return ops


def _refuse_python_operators(program: bytes) -> None:
    """Note [An artifact holds no Python operator]."""
    from .compat import operator_registrations

    found = []
    for op, source in program_operators(program).items():
        if op.startswith("aten::"):  # libtorch's own (torch registers a few CUDA kernels of aten ops from Python)
            continue
        where = operator_registrations(op) or {}
        python = sorted(k for k in ("schema",) + _KERNEL_KEYS if where.get(k, "").endswith(".py"))
        if python:
            found.append((op, source, where[python[0]], python))
    if not found:
        return
    names = ", ".join(op for op, *_ in found)
    detail = "\n".join(f"{op}: {'defined' if 'schema' in keys else 'implemented'} in Python ({', '.join(keys)} "
                        f"registered from {os.path.basename(path)}), called at {source or 'an unknown line'}"
                        for op, source, path, keys in found)
    raise ExportError(finding=Finding(
        what=f"cannot export: operator{'s' if len(found) > 1 else ''} {names} "
             f"{'are' if len(found) > 1 else 'is'} defined in Python, which a C++ program cannot run",
        where=found[0][1], op=found[0][0], detail=detail,
        why="graphex::Module (C++, no Python) calls each operator through the dispatcher; an operator defined "
            "or implemented with a Python function exists only in a Python process",
        fix="write the operator's kernel in C++ with TORCH_LIBRARY / TORCH_LIBRARY_IMPL (`graphex new op NS::NAME "
            "--style cpp` generates one), build it as a shared library, load it in Python with "
            "torch.ops.load_library before exporting, and in C++ pass `graphex-run --load-library LIB.so` "
            "or link the library into the program"))


def _refuse_collectives(program: bytes) -> None:
    """Note [A program belongs to its world] (graphex/distributed.py): a collective names process groups of the
    world it was traced in, which exist only in that torch.distributed job; graphex::Module runs without one.
    A program with no collective does not depend on the world, so only these are refused."""
    found = [(op, source) for op, source in program_operators(program).items() if is_collective(op)]
    if not found:
        return
    raise ExportError(finding=Finding(
        what=f"cannot export: the program calls collective{'s' if len(found) > 1 else ''} "
             f"{', '.join(op for op, _ in found)}, which run only inside the torch.distributed world it was traced in",
        where=found[0][1], op=found[0][0],
        detail="\n".join(f"{op}: called at {source or 'an unknown line'}" for op, source in found),
        why="a collective names the process groups of this job (Note [A program belongs to its world]); an artifact "
            "is run by graphex::Module in a C++ process that has no torch.distributed process groups",
        fix="keep the multi-process step in Python: graphex.inference.cache_compile on every rank (entries are keyed "
            "on rank, world size and groups, so one shared cache directory is safe), or export the part of the model "
            "that runs without collectives"))


def safetensors_bytes(tensors: dict[str, torch.Tensor]) -> bytes:
    """The safetensors layout: u64 header length, JSON header padded with spaces, data; the data section and every
    tensor start at file offsets that are multiples of WEIGHTS_ALIGNMENT, the zero bytes between two tensors are a
    padding entry (PAD_PREFIX + its index, U8 of the gap's length; nothing after the last tensor), so huggingface's
    reader, which wants the data covered without gaps, loads the file: Note [Weights are 64-byte aligned],
    csrc/deploy/safetensors.h. A tensor named with PAD_PREFIX is refused (ExportError)."""
    header: dict[str, Any] = {}
    blobs, end, pads = [], 0, 0
    for name in sorted(tensors):
        if is_padding(name):
            raise ExportError(finding=Finding(
                what=f"cannot write weight {name!r}: names starting with {PAD_PREFIX!r} are reserved for the padding "
                     "entries of graphex's safetensors files",
                why="the zero bytes that keep every tensor 64-byte aligned are entries of that prefix (Note [Weights "
                    "are 64-byte aligned], csrc/deploy/safetensors.h), which every graphex reader skips, so "
                    "graphex::Module would never find this weight",
                fix=f"rename the parameter or buffer (or the submodule holding it) so that its name does not start "
                    f"with {PAD_PREFIX!r}"))
        t = tensors[name].detach().to("cpu").contiguous()
        if t.dtype not in _SAFETENSORS_DTYPES:
            raise ExportError(finding=_unstorable_dtype(name, t.dtype))
        data = t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
        pad = (-end) % WEIGHTS_ALIGNMENT
        if pad:
            header[f"{PAD_PREFIX}{pads}"] = {"dtype": "U8", "shape": [pad], "data_offsets": [end, end + pad]}
            pads += 1
        header[name] = {"dtype": _SAFETENSORS_DTYPES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [end + pad, end + pad + len(data)]}
        blobs.append(b"\0" * pad + data)
        end += pad + len(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((-(8 + len(text))) % WEIGHTS_ALIGNMENT)
    return struct.pack("<Q", len(text)) + text + b"".join(blobs)


def load_safetensors(path: str | os.PathLike) -> dict[str, torch.Tensor]:
    """Read a safetensors file (e.g. graphex-run --output) into name -> tensor (copies); padding entries (PAD_PREFIX,
    Note [Weights are 64-byte aligned]) are skipped."""
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    dtypes = {v: k for k, v in _SAFETENSORS_DTYPES.items()}
    out = {}
    for name, entry in header.items():
        if name == "__metadata__" or is_padding(name):
            continue
        begin, end = (8 + n + o for o in entry["data_offsets"])
        raw = bytearray(data[begin:end])
        flat = torch.frombuffer(raw, dtype=dtypes[entry["dtype"]]) if raw else torch.empty(0, dtype=dtypes[entry["dtype"]])
        out[name] = flat.reshape(entry["shape"]).clone()
    return out
