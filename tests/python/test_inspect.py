"""One format for cache and deploy (Note [One artifact for cache and deploy], graphex/tools/inspecting.py):
a cache entry holds the program graphex.export writes, under a schema'd header; `graphex inspect` reads both."""

from __future__ import annotations

import glob
import json
import os
import struct
import subprocess
import sys

import pytest
import torch

import graphex
from conftest import ROOT
from graphex.base.weights_layout import PAD_PREFIX
from graphex.custom_ops import reset_dynamo
from graphex.inference.entry import HEADER_SCHEMA, Entry, EntryError, decode_entry, encode_entry, read_entry
from graphex.tools.inspecting import InspectError, describe


class _Head(torch.nn.Module):
    def __init__(self, cache_dir: str) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 3)
        self.register_buffer("shift", torch.ones(3))
        self.cached = graphex.inference.cache_compile(self._forward, cache_dir=cache_dir)

    def _forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"y": self.lin(x) + self.shift, "x": x}

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        return self._forward(x)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    reset_dynamo()
    d = tmp_path_factory.mktemp("inspect")
    model = _Head(str(d)).eval()
    x = torch.randn(2, 4)
    with torch.no_grad():
        model.cached(x)
    art = graphex.export(model, (x,), str(d / "art"))
    (entry_path,) = glob.glob(str(d / "*.gxc"))
    return entry_path, art


def test_a_cache_entry_holds_the_program_export_writes(files):
    entry_path, art = files
    entry = read_entry(entry_path)
    with open(os.path.join(art, "program.gxp"), "rb") as f:
        exported = f.read()
    # the same artifact: the programs differ only in their graph's name and the `info` (function, time)
    assert entry.program[8:12] == exported[8:12] == b"GXPG"
    assert len(entry.program) == pytest.approx(len(exported), abs=64)
    assert entry.header["header_schema"] == HEADER_SCHEMA
    out = graphex._C.Module(art)([torch.ones(2, 4)])  # the export loads in the C++ runtime
    assert len(out) == 2


def test_inspect_prints_program_bindings_weights_and_what_it_was_built_for(files):
    entry_path, art = files
    text = "\n".join(describe(art))
    for expected in ("exported artifact", "aten::addmm.default", "<- parameter lin.weight", "<- buffer shift",
                     "<- argument 0", "weights: 3 tensors", "lin.weight", "F32   [3, 4]", '"signature": "(float32[2, 4])"'):
        assert expected in text, text
    text = "\n".join(describe(entry_path))
    for expected in ("cache_compile entry", "weights are not stored", "built for:", "_Head._forward",
                     "signature (float32[2, 4])", HEADER_SCHEMA, "<- parameter lin.weight", "aten::addmm.default"):
        assert expected in text, text
    proc = subprocess.run([sys.executable, "-m", "graphex", "inspect", entry_path], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0 and "<- buffer shift" in proc.stdout, proc.stderr[-2000:]


def test_inspect_does_not_list_padding_entries(files):
    """Note [Weights are 64-byte aligned]: the weights file holds padding entries between tensors (lin.bias is 12
    bytes), which are not weights: inspect counts and lists the three weights alone."""
    _, art = files
    with open(os.path.join(art, "weights.safetensors"), "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        names = list(json.loads(f.read(n)))
    assert any(name.startswith(PAD_PREFIX) for name in names), names
    lines = describe(art)
    assert "weights: 3 tensors, 72 bytes (weights.safetensors)" in lines, lines  # 12 + 48 + 12, no padding
    assert not any(PAD_PREFIX in line for line in lines), lines


def test_inspect_names_what_is_wrong_with_a_bad_file(files, tmp_path):
    entry_path, art = files
    with open(os.path.join(art, "program.gxp"), "rb") as f:
        program = f.read()
    (tmp_path / "cut.gxp").write_bytes(program[:len(program) // 2])
    with pytest.raises(InspectError, match="truncated"):
        describe(str(tmp_path / "cut.gxp"))
    (tmp_path / "foreign.gxp").write_bytes(b"PK\x03\x04" + bytes(64))
    with pytest.raises(InspectError, match="not a graphex program"):
        describe(str(tmp_path / "foreign.gxp"))
    with open(entry_path, "rb") as f:
        data = bytearray(f.read())
    data[len(data) // 2] ^= 0xFF
    (tmp_path / "bad.gxc").write_bytes(bytes(data))
    with pytest.raises(InspectError, match="checksum"):
        describe(str(tmp_path / "bad.gxc"))


def test_a_cache_header_is_checked_against_its_schema(files):
    entry_path, _ = files
    entry = read_entry(entry_path)
    for broken, why in ((dict(entry.header, header_schema="graphex.cache_header/0"), "header schema"),
                        ({k: v for k, v in entry.header.items() if k != "key_parts"}, "'key_parts'"),
                        (dict(entry.header, inputs="all of them"), "'inputs'"),
                        # Note [A program input is bound by one typed Binding]: read back only as written
                        (dict(entry.header, inputs=[{"kind": "global", "name": "W"}]), "not a Binding"),
                        (dict(entry.header, inputs=[{"kind": "arg", "index": "0"}]), "field 'index'"),
                        (dict(entry.header, inputs=[{"kind": "arg", "index": 0, "code": "x"}]), "not a Binding"),
                        (dict(entry.header, outputs=dict(entry.header["outputs"], leaves=[{"kind": "const",
                                                                                           "value": [1]}])),
                         "value is a list")):
        with pytest.raises(EntryError, match=why):
            decode_entry(encode_entry(Entry(json.loads(json.dumps(broken)), entry.program)))
    with pytest.raises(EntryError, match="not a graphex program"):
        decode_entry(encode_entry(Entry(dict(entry.header), b"\0" * 16)))
