"""Read any graphex file for `graphex inspect`: an export directory, its program.gxp, or a cache entry (.gxc).

Note [One artifact for cache and deploy]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
A cache_compile entry holds the very program bytes graphex.export writes as program.gxp
(csrc/schema/program.fbs: program, typed bindings, result leaves and tree, and `info`: what
it was built for), wrapped with the cache's own header (graphex/inference/entry.py: key
parts, sources, custom ops fingerprints, created, compile seconds; schema'd by
`header_schema`). An entry holds no weights (it binds the module's current parameters by
name); an export puts them next to the program in weights.safetensors. So one reader
describes both: this module, which needs no torch (the vendored FlatBuffers runtime and
the safetensors JSON header are enough).
"""

from __future__ import annotations

import json
import os
import struct
from typing import Any

from graphex.base.weights_layout import is_padding

PROGRAM_FILE = "program.gxp"  # graphex/exporting.py's names (not imported: that module imports torch)
WEIGHTS_FILE = "weights.safetensors"


class InspectError(Exception):
    """Not a graphex file, or a damaged one: the message says which and why."""


def describe(path: str) -> list[str]:
    """Readable lines for `path` (raises InspectError)."""
    if os.path.isdir(path):
        program_path = os.path.join(path, PROGRAM_FILE)
        if not os.path.isfile(program_path):
            raise InspectError(f"{path}: a directory without {PROGRAM_FILE}: not a graphex.export artifact")
        lines = [f"{path}: exported artifact (graphex.export)"]
        lines += _program_lines(_read(program_path))
        lines += _weights_lines(os.path.join(path, WEIGHTS_FILE))
        return lines
    data = _read(path)
    from graphex.inference.entry import MAGIC, EntryError, decode_entry

    if data[:len(MAGIC)] == MAGIC:
        try:
            entry = decode_entry(data)
        except EntryError as e:
            raise InspectError(f"{path}: cache entry, unusable: {e}") from None
        lines = [f"{path}: cache_compile entry (weights are not stored: the module's parameters are bound by name)"]
        lines += _header_lines(entry.header)
        return lines + _program_lines(entry.program)
    lines = [f"{path}: program"]
    lines += _program_lines(data)
    weights = os.path.join(os.path.dirname(path), WEIGHTS_FILE)
    return lines + (_weights_lines(weights) if os.path.isfile(weights) else [])


def _read(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        raise InspectError(f"{path}: cannot read: {e.strerror}") from None


def _header_lines(h: dict[str, Any]) -> list[str]:
    fn = h.get("function", {})
    parts = h.get("key_parts") or {}
    lines = ["built for:",
             f"  function   {fn.get('module', '?')}.{fn.get('qualname', '?')}  signature {h.get('signature', '?')}",
             f"  versions   graphex {h.get('graphex')}, torch {h.get('torch')}, program format {h.get('spec_format')}, "
             f"cache format {h.get('cache_format')}",
             f"  options    {json.dumps(parts.get('options'), sort_keys=True)}  dynamic={parts.get('dynamic')} "
             f"grad={parts.get('grad')}",
             f"  world      {json.dumps(parts.get('world'), sort_keys=True)}",
             f"  created    {h.get('created', '?')}, compiled in {h.get('compile_seconds', '?')} s "
             f"(header {h.get('header_schema', 'unversioned')})"]
    for s in h.get("sources", []):
        lines.append(f"  source     {s.get('file', '?')} (sha256 {str(s.get('sha256', '?'))[:12]})"
                     if isinstance(s, dict) else f"  source     {s}")
    for op in h.get("custom_ops", []):
        lines.append(f"  custom op  {op.get('name', op) if isinstance(op, dict) else op}")
    if h.get("guards"):
        lines.append(f"  guards     {h['guards']}")
    return lines


_BINDING_NAMES = {0: "argument", 1: "parameter", 2: "buffer", 3: "size", 4: "stride", 5: "storage_offset", 6: "token"}
_LEAF_NAMES = {0: "output", 1: "argument", 2: "constant"}


def _program_lines(data: bytes) -> list[str]:
    from graphex._vendor import flatbuffers
    from graphex.fb.DType import DType
    from graphex.fb.InputKind import InputKind
    from graphex.fb.NodeKind import NodeKind
    from graphex.fb.Program import Program

    if len(data) < 8 or data[8:12] != b"GXPG":
        raise InspectError("not a graphex program (no GXPG file identifier)")
    (size,) = struct.unpack_from("<I", data, 0)
    if size + 4 != len(data):
        raise InspectError(f"program truncated or padded: its size prefix says {size + 4} bytes, the file has "
                           f"{len(data)}")
    try:
        root = Program.GetRootAs(data, 4)
        dtypes = {v: k.lower() for k, v in vars(DType).items() if not k.startswith("_")}
        kinds = {v: k.lower() for k, v in vars(InputKind).items() if not k.startswith("_")}
        ops: dict[str, int] = {}
        for j in range(root.NodesLength()):
            node = root.Nodes(j)
            if node.Kind() == NodeKind.Op:
                name = f"{(node.Op() or b'').decode()}.{(node.Overload() or b'').decode() or 'default'}"
            else:
                name = "getitem" if node.Kind() == NodeKind.GetItem else "symbolic arithmetic"
            ops[name] = ops.get(name, 0) + 1
        lines = [f"program {(root.Name() or b'').decode()!r}: format {root.FormatVersion()}, {root.NodesLength()} "
                 f"nodes, {root.NumSlots()} slots, {root.NumConstants()} constants "
                 f"({root.ConstantsLength()} inline), signature checked: {bool(root.CheckSignature())}",
                 "operators:"]
        lines += [f"  {n:4d} x {op}" for op, n in sorted(ops.items(), key=lambda kv: (-kv[1], kv[0]))]
        lines.append("inputs (program input <- where it comes from):")
        for i in range(root.InputsLength()):
            inp = root.Inputs(i)
            what = kinds.get(inp.Kind(), "?")
            meta = inp.Tensor()
            if meta is not None:
                sizes = [meta.Sizes(d) for d in range(meta.SizesLength())]
                what = f"tensor {dtypes.get(meta.Dtype(), '?')}{sizes}"
            source = _binding(root.Bindings(i)) if i < root.BindingsLength() else "(no binding: built for one compile)"
            lines.append(f"  {i:3d} {(inp.Name() or b'').decode():<16} {what:<28} <- {source}")
        lines.append(f"result: {root.LeavesLength()} leaves")
        for k in range(root.LeavesLength()):
            leaf = root.Leaves(k)
            lines.append(f"  {k:3d} {_LEAF_NAMES.get(leaf.Kind(), '?')} {leaf.Index() if leaf.Kind() != 2 else ''}")
        if root.Tree():
            lines.append(f"  tree {root.Tree().decode()}")
        if root.Info():
            lines.append(f"info: {root.Info().decode()}")
        return lines
    except (IndexError, struct.error, UnicodeDecodeError, flatbuffers.builder.OffsetArithmeticError) as e:  # type: ignore[attr-defined]
        raise InspectError(f"malformed program: {e}") from None


def _binding(b: Any) -> str:
    kind = _BINDING_NAMES.get(b.Kind(), "?")
    if kind in ("parameter", "buffer"):
        return f"{kind} {(b.Name() or b'').decode()}"
    if kind in ("size", "stride"):
        return f"argument {b.Index()}.{kind}({b.Dim()})"
    if kind == "storage_offset":
        return f"argument {b.Index()}.storage_offset()"
    return "None (effect token)" if kind == "token" else f"argument {b.Index()}"


def _weights_lines(path: str) -> list[str]:
    if not os.path.isfile(path):
        return [f"weights: {path} is missing"]
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise InspectError(f"{path}: truncated safetensors file")
        (n,) = struct.unpack("<Q", head)
        if n > os.path.getsize(path) - 8:
            raise InspectError(f"{path}: safetensors header of {n} bytes runs past the end of the file")
        try:
            header = json.loads(f.read(n))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise InspectError(f"{path}: malformed safetensors header: {e}") from None
    # Padding entries (Note [Weights are 64-byte aligned], csrc/deploy/safetensors.h) are not weights.
    tensors = {k: v for k, v in header.items() if k != "__metadata__" and not is_padding(k)}
    total = sum(v["data_offsets"][1] - v["data_offsets"][0] for v in tensors.values())
    lines = [f"weights: {len(tensors)} tensors, {total} bytes ({os.path.basename(path)})"]
    lines += [f"  {name:<32} {v['dtype']:<5} {v['shape']}" for name, v in sorted(tensors.items())]
    return lines
