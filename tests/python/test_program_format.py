"""The program artifact (Note [One typed format], csrc/program/format.h): one schema, one encoder,
a verifier in C++ that names what is wrong with a bad file before anything runs."""

import os
import shutil
import subprocess
import sys

import pytest
import torch

from graphex import _C
from graphex.program import encode as _spec
from graphex.errors import ProgramError
from graphex.fb import DType, Program
from graphex.lowering import lower

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _lowered():
    def f(x, y):
        return (x.to(torch.bfloat16) * y).sum(0, dtype=torch.float64)

    graphs = []

    def backend(gm, example_inputs):
        from torch._functorch.aot_autograd import aot_module_simplified

        def fw(g, ex):
            graphs.append(g)
            return g.forward
        return aot_module_simplified(gm, example_inputs, fw_compiler=fw)

    x, y = torch.randn(3, 4), torch.randn(3, 4, dtype=torch.bfloat16)
    torch.compile(f, backend=backend, fullgraph=True)(x, y)
    return lower(graphs[0], name="f"), (x, y), f(x, y)


def test_program_bytes_are_typed_with_graphex_enums():
    lowered, args, expected = _lowered()
    data = _spec.encode(lowered.program, lowered.constants)
    assert data[8:12] == b"GXPG"
    program = Program.Program.GetRootAs(data, 4)  # after the size prefix
    assert program.FormatVersion() == _spec.FORMAT_VERSION == _C.SPEC_FORMAT_VERSION
    # dtypes on disk are graphex's DType, not c10 codes (c10's bfloat16 is 15, graphex's 7)
    assert program.Inputs(1).Tensor().Dtype() == DType.DType.BFloat16 == 7
    dtype_args = [program.Nodes(i).Kwargs(k).Value().Dtype()
                  for i in range(program.NodesLength()) for k in range(program.Nodes(i).KwargsLength())
                  if program.Nodes(i).Kwargs(k).Name() == b"dtype"]
    assert DType.DType.Float64 in dtype_args
    out = _C.Executor(data, [])(list(args))
    assert torch.equal(out[0], expected)


def test_bad_bytes_are_refused_before_anything_runs_with_the_reason():
    lowered, _, _ = _lowered()
    data = _spec.encode(lowered.program, lowered.constants)
    cases = {
        b"": "not a graphex program",
        b"PK\x03\x04" + b"\0" * 60: "not a graphex program",  # a torch.save zip
        data[:-3]: "truncated",
        data + b"\0": "trailing bytes",
        data[:4] + b"\xff\xff\xff\x00" + data[8:]: "corrupt",
    }
    for bad, reason in cases.items():
        with pytest.raises(ProgramError, match=reason):
            _C.Executor(bad, [])


def test_generated_python_matches_the_schema(tmp_path):
    """graphex/fb/ is flatc's output for csrc/schema/program.fbs (`make schema` regenerates it)."""
    assert shutil.which("flatc"), "flatc not installed: `make build` installs it (flatbuffers-compiler)"
    subprocess.run(["flatc", "--python", "-o", str(tmp_path), os.path.join(ROOT, "csrc/schema/program.fbs")],
                   check=True)
    generated = tmp_path / "graphex" / "fb"
    committed = os.path.join(ROOT, "graphex", "fb")
    names = sorted(p.name for p in generated.iterdir())
    assert names == sorted(os.listdir(committed)) or names == sorted(
        n for n in os.listdir(committed) if n != "__pycache__")
    for name in names:
        with open(os.path.join(committed, name), "rb") as f:
            assert f.read() == _vendored_imports((generated / name).read_bytes()), \
                f"graphex/fb/{name} is stale: run `make schema`"


def _vendored_imports(code: bytes) -> bytes:
    """What `make schema` does to flatc's output: import the FlatBuffers runtime graphex vendors."""
    lines = code.decode().split("\n")
    lines = ["from graphex._vendor import flatbuffers" if line == "import flatbuffers" else
             line.replace("from flatbuffers.compat import", "from graphex._vendor.flatbuffers.compat import")
             for line in lines]
    return "\n".join(lines).encode()


def test_graphex_runs_without_the_flatbuffers_package():
    """The FlatBuffers runtime is vendored: torch stays graphex's only runtime dependency."""
    code = ("import sys; sys.modules['flatbuffers'] = None\n"
            "import torch, graphex\n"
            "f = torch.compile(lambda x: x * 2 + 1, backend='graphex', fullgraph=True)\n"
            "with torch.no_grad():\n"
            "    x = torch.randn(3); assert torch.equal(f(x), x * 2 + 1)\n"
            "print('ok')\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0 and "ok" in result.stdout, result.stderr[-2000:]


def test_a_negative_zero_argument_survives_the_format(tmp_path):
    """Note [A float's sign survives the format]: FlatBuffers leaves out a field equal to its default and -0.0 == 0.0,
    so `x * -0.0` was replayed as `x * 0.0` (every sign of zero wrong, in exact mode); found by a helper's adversarial
    run. In process and through an exported program."""
    import os
    import subprocess

    import graphex
    from graphex.exporting import load_safetensors, safetensors_bytes

    class M(torch.nn.Module):
        def forward(self, x):
            return x * -0.0, torch.add(x, 1.0, alpha=-0.0), torch.full_like(x, -0.0)

    x = torch.tensor([-0.0, 0.0, -1.0, 1.0, float("inf")])
    want = M()(x)
    torch._dynamo.reset()
    got = torch.compile(M(), backend="graphex", fullgraph=True, dynamic=False)(x)
    for g, w in zip(got, want):
        assert torch.equal(g.isnan(), w.isnan()) and torch.equal(torch.signbit(g), torch.signbit(w)), (g, w)
    runner = os.path.join(os.environ.get("GRAPHEX_BUILD_DIR") or os.path.join(ROOT, "build", "py"), "graphex-run")
    path = graphex.export(M(), (x,), tmp_path / "negzero.graphex")
    (tmp_path / "in.safetensors").write_bytes(safetensors_bytes({"0": x}))
    proc = subprocess.run([runner, path, "--inputs", str(tmp_path / "in.safetensors"),
                           "--output", str(tmp_path / "out.safetensors")], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    out = load_safetensors(tmp_path / "out.safetensors")
    for i, w in enumerate(want):
        assert torch.equal(torch.signbit(out[str(i)]), torch.signbit(w)), (i, out[str(i)], w)
