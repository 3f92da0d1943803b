"""graphex-run (C++, no Python): runs an exported artifact on a safetensors file of inputs and writes
the flattened result as safetensors; its output is bitwise equal to eager, under every CPU capability
(Note [Weights are 64-byte aligned], csrc/deploy/safetensors.h)."""

import collections
import json
import os
import struct
import subprocess
import sys

import pytest
import torch

import graphex
from graphex.base.weights_layout import PAD_PREFIX
from graphex.exporting import WEIGHTS_ALIGNMENT, WEIGHTS_FILE, load_safetensors, safetensors_bytes
from examples.models.decoder import build_decoder

from conftest import ROOT, require

GRAPHEX_RUN = os.path.join(os.environ.get("GRAPHEX_BUILD_DIR") or os.path.join(ROOT, "build", "py"), "graphex-run")


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 4)
        self.register_buffer("scale", torch.tensor([0.5, 2.0, 1.0, 3.0]))

    def forward(self, x, mask):
        return {"y": torch.relu(self.fc(x)) * self.scale, "m": mask.logical_not(), "n": 3}


def test_graphex_run_output_file_is_bitwise_equal_to_eager(tmp_path):
    assert os.path.exists(GRAPHEX_RUN), "graphex-run is not built: pip install --no-build-isolation -e . (make build)"
    torch.manual_seed(0)
    model = Net().eval()
    x, mask = torch.randn(2, 8), torch.tensor([True, False, True])
    path = graphex.export(model, (x, mask), tmp_path / "net.graphex")
    x2 = torch.randn(2, 8)
    (tmp_path / "in.safetensors").write_bytes(safetensors_bytes({"0": x2, "1": mask}))
    proc = subprocess.run([GRAPHEX_RUN, path, "--inputs", str(tmp_path / "in.safetensors"),
                           "--output", str(tmp_path / "out.safetensors"), "--bench", "5"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "median run time:" in proc.stdout and "over 5 runs" in proc.stdout
    out = load_safetensors(tmp_path / "out.safetensors")
    with torch.no_grad():
        expected = model(x2, mask)
    assert sorted(out) == ["0", "1", "2"]
    assert torch.equal(out["0"], expected["y"]) and torch.equal(out["1"], expected["m"])
    assert out["2"].dtype == torch.int64 and out["2"].item() == 3  # a number leaf: a 0-dim tensor

    # Without --inputs the runner says what to pass; a wrongly named input is refused, not defaulted.
    proc = subprocess.run([GRAPHEX_RUN, path], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "takes 2 arguments: pass them with --inputs FILE" in proc.stderr
    (tmp_path / "bad.safetensors").write_bytes(safetensors_bytes({"0": x2, "x": mask}))
    proc = subprocess.run([GRAPHEX_RUN, path, "--inputs", str(tmp_path / "bad.safetensors")],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and 'none named "1"' in proc.stderr


def file_offsets(path, padding: bool = False) -> dict[str, int]:
    """name -> the file offset where the tensor's bytes start (the header parsed here, not by graphex); padding
    entries (PAD_PREFIX, Note [Weights are 64-byte aligned]) only when asked for."""
    data = open(path, "rb").read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    return {name: 8 + n + entry["data_offsets"][0] for name, entry in header.items()
            if name != "__metadata__" and (padding or not name.startswith(PAD_PREFIX))}


def test_weights_and_outputs_start_every_tensor_on_64_bytes(tmp_path):
    """Note [Weights are 64-byte aligned]: the header is padded with spaces (counted by the length field) and the
    gaps between tensors are U8 padding entries of zeros, by the Python writer (export, safetensors_bytes) and the
    C++ one (graphex-run --output), the same bytes for the same tensors."""
    assert WEIGHTS_ALIGNMENT == 64
    torch.manual_seed(0)
    model = Net().eval()  # fc.bias, fc.weight, scale: 16, 128 and 16 bytes, so padding after fc.bias
    x, mask = torch.randn(2, 8), torch.tensor([True, False, True])
    path = graphex.export(model, (x, mask), tmp_path / "net.graphex")
    weights = os.path.join(path, WEIGHTS_FILE)
    data = open(weights, "rb").read()
    (n,) = struct.unpack("<Q", data[:8])
    text = data[8:8 + n].decode()
    assert (8 + n) % 64 == 0 and text.rstrip(" ").endswith("}"), text  # the length field counts the spaces
    header = json.loads(text)
    offsets = file_offsets(weights)
    assert sorted(offsets) == ["fc.bias", "fc.weight", "scale"], offsets
    assert all(offset % 64 == 0 for offset in offsets.values()), offsets
    pads = {k: v for k, v in header.items() if k.startswith(PAD_PREFIX)}
    assert pads == {f"{PAD_PREFIX}0": {"dtype": "U8", "shape": [48], "data_offsets": [16, 64]}}, header
    spans = sorted((8 + n + b, 8 + n + e) for b, e in (v["data_offsets"] for v in header.values()))
    assert spans[0][0] == 8 + n and spans[-1][1] == len(data)  # the data section covered, nothing after the last
    assert all(end == begin for (_, end), (begin, _) in zip(spans, spans[1:])), spans  # no gap
    assert data[8 + n + 16:8 + n + 64] == bytes(48)  # the padding is zeros
    named = dict(model.named_parameters()) | dict(model.named_buffers())
    loaded = load_safetensors(weights)  # graphex's reader skips the padding
    assert sorted(loaded) == sorted(named) and all(torch.equal(t, named[k]) for k, t in loaded.items())

    inputs, out = tmp_path / "in.safetensors", tmp_path / "out.safetensors"
    inputs.write_bytes(safetensors_bytes({"0": x, "1": mask}))
    assert all(offset % 64 == 0 for offset in file_offsets(inputs).values())
    proc = subprocess.run([GRAPHEX_RUN, path, "--inputs", str(inputs), "--output", str(out)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    offsets = file_offsets(out)  # leaves of 32, 3 and 8 bytes
    assert sorted(offsets) == ["0", "1", "2"] and all(offset % 64 == 0 for offset in offsets.values()), offsets
    with torch.no_grad():
        expected = model(x, mask)
    result = load_safetensors(out)
    assert sorted(result) == ["0", "1", "2"]  # the padding entries skipped
    assert torch.equal(result["0"], expected["y"]) and torch.equal(result["1"], expected["m"])
    assert sorted(file_offsets(out, padding=True)) == ["0", "1", "2", f"{PAD_PREFIX}0", f"{PAD_PREFIX}1"]
    assert out.read_bytes() == safetensors_bytes(result)  # the C++ writer lays the file out as the Python one


def reference_load(path, expected: dict[str, torch.Tensor]) -> None:
    """huggingface's reader (safetensors.torch.load_file and safe_open) loads `path`; its tensors, the padding
    entries left out by their prefix, are `expected` bit for bit, each at a 64-aligned file offset; each padding
    entry is 1..63 zero bytes (Note [Weights are 64-byte aligned])."""
    from safetensors import safe_open
    from safetensors.torch import load_file

    loaded = load_file(path)
    with safe_open(str(path), framework="pt") as f:
        opened = {name: f.get_tensor(name) for name in f.keys()}
    assert sorted(loaded) == sorted(opened)
    real = {name: t for name, t in loaded.items() if not name.startswith(PAD_PREFIX)}
    assert sorted(real) == sorted(expected)
    for name, t in real.items():
        want = expected[name].detach()
        assert t.dtype == want.dtype and t.shape == want.shape and torch.equal(t, want), name
        assert torch.equal(opened[name], t), name
    for name, t in loaded.items():
        if name.startswith(PAD_PREFIX):
            assert t.dtype == torch.uint8 and t.dim() == 1 and 0 < t.numel() < 64 and not t.any(), (name, t)
    offsets = file_offsets(path)
    assert sorted(offsets) == sorted(expected) and all(o % 64 == 0 for o in offsets.values()), offsets


def test_the_reference_safetensors_reader_loads_weights_and_outputs(tmp_path):
    """Note [Weights are 64-byte aligned]: the padding between tensors is an entry, so huggingface's reader (which
    refuses gaps) loads what export and graphex-run --output write, tensors equal to the model's."""
    require("safetensors.torch")
    assert os.path.exists(GRAPHEX_RUN), "graphex-run is not built (make build)"
    torch.manual_seed(0)
    lin = torch.nn.Linear(8, 4).eval()  # bias of 16 bytes, then 48 bytes of padding, then the weight
    path = graphex.export(lin, (torch.randn(1, 8),), tmp_path / "lin.graphex")
    weights = os.path.join(path, WEIGHTS_FILE)
    assert sorted(file_offsets(weights, padding=True)) == ["__graphex_pad_0", "bias", "weight"]
    reference_load(weights, dict(lin.named_parameters()))

    decoder = build_decoder()  # the shipped model: parameters and buffers, a custom op
    k, v = (torch.randn_like(c) for c in decoder.new_cache())
    args = (torch.tensor([[7]]), torch.tensor([5]), k, v)
    path = graphex.export(decoder, args, tmp_path / "decoder.graphex")
    reference_load(os.path.join(path, WEIGHTS_FILE), dict(decoder.named_parameters()) | dict(decoder.named_buffers()))

    # Inputs of 8, 8 and larger bytes: padding that graphex-run's reader skips (it counts the tensors).
    inputs, out = tmp_path / "in.safetensors", tmp_path / "out.safetensors"
    inputs.write_bytes(safetensors_bytes({str(i): a for i, a in enumerate(args)}))
    assert any(name.startswith(PAD_PREFIX) for name in file_offsets(inputs, padding=True))
    reference_load(inputs, {str(i): a for i, a in enumerate(args)})
    proc = subprocess.run([GRAPHEX_RUN, path, "--inputs", str(inputs), "--output", str(out)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    with torch.no_grad():
        expected = decoder(*args)
    reference_load(out, {"0": expected})

    # graphex-run --output with leaves of 32, 3 and 8 bytes (padding after the first two).
    net = Net().eval()
    x, mask = torch.randn(2, 8), torch.tensor([True, False, True])
    path = graphex.export(net, (x, mask), tmp_path / "net.graphex")
    inputs.write_bytes(safetensors_bytes({"0": x, "1": mask}))
    proc = subprocess.run([GRAPHEX_RUN, path, "--inputs", str(inputs), "--output", str(out)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    with torch.no_grad():
        expected = net(x, mask)
    reference_load(out, {"0": expected["y"], "1": expected["m"], "2": torch.tensor(3)})


# A name's length moves every tensor after the header: with the former 8-byte layout, names of 1-4 letters put
# this Linear's weight and bias 24 bytes past a 64-byte boundary (8 off a 16-byte one, which MKL rounds differently
# on AMD EPYC) and names of 5-8 letters 32 bytes past it. test_export.py loads tensors at every multiple of 8.
LINEAR_NAMES = ["abcdefgh"[:n] for n in range(1, 9)]
CAPABILITIES = {"default": None, "avx2": "avx2", "avx512": "avx512f"}  # ATEN_CPU_CAPABILITY -> the cpuinfo flag


def cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo") as f:
            return next((set(line.split(":", 1)[1].split()) for line in f if line.startswith("flags")), set())
    except OSError:
        return set()


def linear_named(name: str) -> torch.nn.Module:
    return torch.nn.Sequential(collections.OrderedDict([(name, torch.nn.Linear(256, 256))])).eval()


# Eager in its own process, so that it runs under the ATEN_CPU_CAPABILITY graphex-run runs under; the models get
# the exporting process's parameters and buffers (copied into tensors of their own, as eager allocates them).
EAGER = """
import collections, json, sys
import torch
sys.path.insert(0, sys.argv[1])
from graphex.exporting import load_safetensors, safetensors_bytes
from examples.models.decoder import build_decoder
cases, out = json.loads(sys.argv[2]), sys.argv[3]
results = {}
for case in cases:
    if case["model"] == "decoder":
        model = build_decoder()
    else:  # linear_named
        model = torch.nn.Sequential(collections.OrderedDict([(case["model"], torch.nn.Linear(256, 256))])).eval()
    own = dict(model.named_parameters()) | dict(model.named_buffers())
    state = load_safetensors(case["state"])
    assert own.keys() == state.keys(), (sorted(own), sorted(state))
    inputs = load_safetensors(case["inputs"])
    with torch.no_grad():
        for name, t in state.items():
            own[name].copy_(t)
        results[case["model"]] = model(*(inputs[str(i)] for i in range(len(inputs))))
open(out, "wb").write(safetensors_bytes(results))
print(torch.backends.cpu.get_cpu_capability())
"""


@pytest.fixture(scope="module")
def bitwise_cases(tmp_path_factory):
    """Exported artifacts, their inputs and the exporting process's weights: one Linear(256, 256) under each name
    of LINEAR_NAMES, and the shipped decoder (examples/models/decoder.py) one step into a filled cache."""
    d = tmp_path_factory.mktemp("bitwise")
    cases = []

    def add(key, model, args):
        art = graphex.export(model, args, d / f"{key}.graphex")
        (d / f"{key}.in.safetensors").write_bytes(safetensors_bytes({str(i): a for i, a in enumerate(args)}))
        state = dict(model.named_parameters()) | dict(model.named_buffers())
        (d / f"{key}.state.safetensors").write_bytes(safetensors_bytes(state))
        cases.append({"model": key, "artifact": art, "inputs": str(d / f"{key}.in.safetensors"),
                      "state": str(d / f"{key}.state.safetensors")})

    torch.manual_seed(0)
    x = torch.randn(1, 256)
    for i, name in enumerate(LINEAR_NAMES):
        torch.manual_seed(i)
        add(name, linear_named(name), (x,))
    decoder = build_decoder()
    torch.manual_seed(1)
    k, v = (torch.randn_like(c) for c in decoder.new_cache())
    add("decoder", decoder, (torch.tensor([[7]]), torch.tensor([5]), k, v))
    return cases


@pytest.mark.parametrize("capability", list(CAPABILITIES))
def test_graphex_run_is_bitwise_equal_to_eager_under_every_cpu_capability(bitwise_cases, capability, tmp_path):
    """Note [Weights are 64-byte aligned]: the mapped weights are aligned as eager's are, so graphex-run takes the
    kernels' (MKL's) path eager takes, whatever the parameter names, under each ATEN_CPU_CAPABILITY this CPU has."""
    flag = CAPABILITIES[capability]
    if flag and flag not in cpu_flags():
        pytest.skip(f"this CPU has no {flag} (/proc/cpuinfo), so ATEN_CPU_CAPABILITY={capability} is not its path")
    assert os.path.exists(GRAPHEX_RUN), "graphex-run is not built (make build)"
    cases = bitwise_cases
    env = dict(os.environ, ATEN_CPU_CAPABILITY=capability)
    eager_file = tmp_path / "eager.safetensors"
    proc = subprocess.run([sys.executable, "-c", EAGER, ROOT, json.dumps(cases), str(eager_file)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    assert proc.stdout.split()[-1] == capability.upper(), proc.stdout  # eager ran under that capability
    eager = load_safetensors(eager_file)
    differ = []
    for case in cases:
        out = tmp_path / f"{case['model']}.out.safetensors"
        proc = subprocess.run([GRAPHEX_RUN, case["artifact"], "--inputs", case["inputs"], "--output", str(out)],
                              env=env, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
        got, expected = load_safetensors(out)["0"], eager[case["model"]]
        assert got.shape == expected.shape and got.dtype == expected.dtype
        if not torch.equal(got, expected):
            differ.append(f"{case['model']}: max abs diff {(got - expected).abs().max().item():.3g}")
    assert not differ, f"graphex-run differs from eager under ATEN_CPU_CAPABILITY={capability}: {differ}"
