"""graphex.export writes program + safetensors weights; graphex::Module (C++, no Python) loads and runs them."""

import json
import os
import shutil
import struct
import subprocess
import sys

import pytest
import torch

import graphex
from graphex.base.weights_layout import PAD_PREFIX
from graphex.exporting import WEIGHTS_FILE, ExportError, safetensors_bytes
from graphex import _C
from graphex.errors import ProgramError


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 4)
        self.register_buffer("scale", torch.tensor([0.5, 2.0, 1.0, 3.0]))

    def forward(self, x):
        return {"y": torch.relu(self.fc(x)) * self.scale, "n": 3}


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    torch.manual_seed(0)
    model = Net().eval()
    x = torch.randn(2, 8)
    path = graphex.export(model, (x,), tmp_path_factory.mktemp("art") / "net.graphex")
    return model, x, path


def test_export_runs_in_the_cpp_runtime_bitwise_equal_to_eager(exported):
    model, x, path = exported
    assert sorted(os.listdir(path)) == ["program.gxp", "weights.safetensors"]
    module = _C.Module(path)
    with torch.no_grad():
        expected = model(x)
    out = module([x])
    assert torch.equal(out[0], expected["y"]) and out[1] == 3  # result leaves: graph output, constant
    x2 = torch.randn(2, 8)
    with torch.no_grad():
        assert torch.equal(module([x2])[0], model(x2)["y"])


def test_weights_are_bound_by_name_and_checked(exported, tmp_path):
    model, x, path = exported
    program = open(os.path.join(path, "program.gxp"), "rb").read()
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "program.gxp").write_bytes(program)
    weights = {"fc.weight": model.fc.weight, "fc.bias": model.fc.bias, "scale": torch.zeros(5)}
    (bad / "weights.safetensors").write_bytes(safetensors_bytes(weights))
    with pytest.raises(ProgramError, match="weight 'scale' does not match the program"):
        _C.Module(str(bad))
    del weights["scale"]
    (bad / "weights.safetensors").write_bytes(safetensors_bytes(weights))
    with pytest.raises(ProgramError, match="no tensor 'scale'"):
        _C.Module(str(bad))
    good = open(os.path.join(path, "weights.safetensors"), "rb").read()
    (bad / "weights.safetensors").write_bytes(good[:-7])
    with pytest.raises(ProgramError, match="outside the file|truncated"):
        _C.Module(str(bad))
    (bad / "program.gxp").write_bytes(program[:-5])
    with pytest.raises(ProgramError, match="truncated"):
        _C.Module(str(bad))


def misaligned_safetensors(tensors: dict[str, torch.Tensor], residue: int) -> tuple[bytes, list[int]]:
    """A safetensors file as an 8-byte-aligned writer lays it out, with the data section at a file offset of
    `residue` modulo 64; returns it and each tensor's file offset."""
    header, blobs, end = {}, [], 0
    for name, t in sorted(tensors.items()):
        data = t.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
        pad = (-end) % 8
        header[name] = {"dtype": "F32", "shape": list(t.shape), "data_offsets": [end + pad, end + pad + len(data)]}
        blobs.append(b"\0" * pad + data)
        end += pad + len(data)
    text = json.dumps(header).encode()
    text += b" " * ((residue - 8 - len(text)) % 64)
    return (struct.pack("<Q", len(text)) + text + b"".join(blobs),
            [8 + len(text) + v["data_offsets"][0] for v in header.values()])


def test_weights_off_64_byte_alignment_are_copied_and_give_the_same_bits(tmp_path):
    """Note [Weights are 64-byte aligned]: a weights file written by another tool, its tensors at every multiple of
    8 modulo 64, loads and runs bit for bit as the aligned file export wrote (and as eager)."""
    torch.manual_seed(0)
    model = torch.nn.Linear(256, 256).eval()
    x = torch.randn(1, 256)
    path = graphex.export(model, (x,), tmp_path / "lin.graphex")
    with torch.no_grad():
        expected = model(x)
    aligned = _C.Module(path)([x])[0]
    assert torch.equal(aligned, expected)
    for residue in range(8, 64, 8):
        art = tmp_path / f"off{residue}"
        art.mkdir()
        shutil.copy(os.path.join(path, "program.gxp"), art / "program.gxp")
        data, offsets = misaligned_safetensors({"weight": model.weight, "bias": model.bias}, residue)
        assert [o % 64 for o in offsets] == [residue, residue]
        (art / WEIGHTS_FILE).write_bytes(data)
        out = _C.Module(str(art))([x])[0]
        assert torch.equal(out, aligned), f"tensors at {residue} mod 64: max abs diff {(out - aligned).abs().max()}"


class ReservedName(torch.nn.Module):
    """A parameter whose name starts with the prefix of the padding entries."""

    def __init__(self):
        super().__init__()
        self.register_parameter(PAD_PREFIX + "w", torch.nn.Parameter(torch.randn(4)))

    def forward(self, x):
        return x * getattr(self, PAD_PREFIX + "w")


def test_a_weight_named_like_padding_is_refused(tmp_path):
    """Note [Weights are 64-byte aligned]: readers skip entries named with PAD_PREFIX, so a weight named so would
    be lost; export refuses it, naming the weight and the fix, and writes nothing."""
    with pytest.raises(ExportError, match=f"cannot write weight '{PAD_PREFIX}w': names starting with "
                                          f"'{PAD_PREFIX}' are reserved") as info:
        graphex.export(ReservedName().eval(), (torch.randn(4),), tmp_path / "reserved.graphex")
    assert "rename the parameter or buffer" in str(info.value)
    assert not (tmp_path / "reserved.graphex" / WEIGHTS_FILE).exists()
    with pytest.raises(ExportError, match="reserved"):
        safetensors_bytes({"x": torch.ones(3), f"{PAD_PREFIX}0": torch.zeros(5, dtype=torch.uint8)})


def test_graphex_export_is_the_function_and_the_command(tmp_path):
    assert callable(graphex.export) and graphex.export is graphex.exporting.export
    script = tmp_path / "make_net.py"
    script.write_text("import torch\n\n"
                      "def make():\n"
                      "    torch.manual_seed(1)\n"
                      "    return torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.ReLU()).eval(), (torch.randn(3, 8),)\n")
    out = tmp_path / "cli.graphex"
    proc = subprocess.run([sys.executable, "-m", "graphex", "export", f"{script}:make", str(out)], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    assert sorted(os.listdir(out)) == ["program.gxp", "weights.safetensors"]
    torch.manual_seed(1)
    model, x = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.ReLU()).eval(), torch.randn(3, 8)
    with torch.no_grad():
        assert torch.equal(_C.Module(str(out))([x])[0], model(x))


def test_a_program_with_collectives_is_refused_naming_the_op_and_the_fix(tmp_path):
    """Note [A program belongs to its world]: an artifact runs without torch.distributed, so a collective cannot be
    exported; run in a 1-rank gloo world in a fresh process (the process group is process-wide)."""
    code = f"""
import os, torch, torch.distributed as dist, graphex
import torch.distributed._functional_collectives as funcol
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29531")
dist.init_process_group("gloo", rank=0, world_size=1)
def step(x):
    return funcol.all_reduce(x * 2, "sum", dist.group.WORLD) + 1
try:
    graphex.export(step, (torch.randn(4),), {str(tmp_path / 'tp.graphex')!r})
except graphex.ExportError as e:
    print("REFUSED", e.finding.op, "|", e.finding.what, "|", e.finding.fix, "|", e.finding.where)
finally:
    dist.destroy_process_group()
"""
    script = tmp_path / "tp_export.py"
    script.write_text(code)
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    assert "REFUSED" in out.stdout, out.stdout + out.stderr
    assert "_c10d_functional::all_reduce" in out.stdout and "cache_compile on every rank" in out.stdout, out.stdout
    assert "tp_export.py" in out.stdout.split("|")[-1], out.stdout  # the user's line is named
    assert not (tmp_path / "tp.graphex").exists()  # nothing half-written


def test_two_views_of_one_value_are_two_tensors_in_the_cpp_runtime(tmp_path):
    """Note [Two views of one output are two tensors]: an exported result leaf may be another view of an output
    (program format 4); graphex::Module returns `alias()` of it, a tensor of its own on the same memory."""
    class Views(torch.nn.Module):
        def forward(self, x):
            return x.view(-1), x.view(-1), x * 2

    x = torch.randn(2, 3)
    path = graphex.export(Views(), (x,), tmp_path / "views.graphex")
    with torch.no_grad():
        a, b, h = _C.Module(path)([x])
    assert torch.equal(a, x.view(-1)) and torch.equal(b, a) and torch.equal(h, x * 2)
    assert a is not b and a.data_ptr() == b.data_ptr() == x.data_ptr()
    a.unsqueeze_(0)
    assert b.shape == (6,)


class _ComplexTable(torch.nn.Module):  # Meta's Llama: the rotary table `freqs_cis` a complex64 buffer
    def __init__(self):
        super().__init__()
        torch.manual_seed(3)
        self.register_buffer("freqs_cis", torch.polar(torch.ones(1, 3, 1, 4), torch.randn(1, 3, 1, 4)))

    def forward(self, q):
        pairs = torch.view_as_complex(q.float().reshape(*q.shape[:-1], -1, 2))
        return torch.view_as_real(pairs * self.freqs_cis).flatten(3).type_as(q)


@pytest.mark.parametrize("fused", [False, True], ids=["exact", "fused"])
def test_a_complex_buffer_is_refused_with_a_fix_that_exports_when_pasted(tmp_path, monkeypatch, fused):
    """safetensors holds no complex dtype: export names the buffer and prints the two lines that keep it as floats.
    Those lines, pasted as printed into the module, export; the C++ runtime then gives eager's result (bitwise exact,
    and in fused mode through the interleaved rotary kernel, Meta's complex form)."""
    options = {"pattern_fusion_pass": True} if fused else {}
    q = torch.randn(1, 3, 2, 8)
    with pytest.raises(ExportError, match="cannot write weight 'freqs_cis': its dtype torch.complex64") as info:
        graphex.export(_ComplexTable().eval(), (q,), tmp_path / "complex.graphex", options=options)
    assert not (tmp_path / "complex.graphex" / WEIGHTS_FILE).exists()
    lines = [ln.strip() for ln in str(info.value).splitlines() if "# in __init__" in ln or "# in forward" in ln]
    assert len(lines) == 2, str(info.value)
    init_line, forward_line = lines
    source = ("import torch\n"
              "class Fixed(torch.nn.Module):\n"
              "    def __init__(self):\n"
              "        super().__init__()\n"
              "        torch.manual_seed(3)\n"
              "        table = torch.polar(torch.ones(1, 3, 1, 4), torch.randn(1, 3, 1, 4))\n"
              f"        {init_line}\n"
              "    def forward(self, q):\n"
              f"        {forward_line}\n"
              "        pairs = torch.view_as_complex(q.float().reshape(*q.shape[:-1], -1, 2))\n"
              "        return torch.view_as_real(pairs * table).flatten(3).type_as(q)\n")
    import importlib

    name = f"pasted_fix_{'fused' if fused else 'exact'}"
    (tmp_path / f"{name}.py").write_text(source)  # a module of its own, as a user's script: export reads its source
    monkeypatch.syspath_prepend(str(tmp_path))
    fixed = importlib.import_module(name).Fixed().eval()
    with torch.no_grad():
        want = _ComplexTable().eval()(q)
        assert torch.equal(fixed(q), want)
    from graphex.compile import on_capture

    captured = []
    with on_capture(lambda graph, compiled: captured.append(compiled)):
        path = graphex.export(fixed, (q,), tmp_path / "fixed.graphex", options=options)
    (got,) = _C.Module(str(path))([q])
    if fused:
        assert captured[-1].fused.get("rotary") == 1, captured[-1].fused
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    else:
        assert torch.equal(got, want)


class _WritesOneReadsTheOther(torch.nn.Module):
    def forward(self, a, b):
        a.mul_(2)
        return a + b


def test_one_tensor_passed_as_two_inputs_is_refused(tmp_path):
    """Note [Bound inputs are separate tensors]: a program exported with two tensors, run with one passed twice,
    would read its own write; graphex::Module refuses it, naming both inputs."""
    path = graphex.export(_WritesOneReadsTheOther(), (torch.ones(3), torch.ones(3)), tmp_path / "m.graphex")
    module = _C.Module(str(path))
    a, b = torch.ones(3), torch.ones(3)
    assert torch.equal(module([a, b])[0], torch.full((3,), 3.0))
    x = torch.ones(3)
    with pytest.raises(graphex.SignatureError, match="inputs 0 .* and 1 .* are the same tensor"):
        module([x, x])
    assert torch.equal(x, torch.ones(3))  # refused before anything ran
