"""The program artifact (Note [One typed format], csrc/program/format.h): one schema, one encoder,
a verifier in C++ that names what is wrong with a bad file before anything runs."""

import os
import shutil
import subprocess

import pytest
import torch

from graphex import _C, _spec
from graphex.errors import ProgramError
from graphex.fb import DType, Program
from graphex.lower import lower

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
    data = _spec.encode(lowered.spec, lowered.constants)
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
    data = _spec.encode(lowered.spec, lowered.constants)
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


@pytest.mark.skipif(shutil.which("flatc") is None, reason="flatc not installed")
def test_generated_python_matches_the_schema(tmp_path):
    """graphex/fb/ is flatc's output for csrc/schema/program.fbs (`make schema` regenerates it)."""
    subprocess.run(["flatc", "--python", "-o", str(tmp_path), os.path.join(ROOT, "csrc/schema/program.fbs")],
                   check=True)
    generated = tmp_path / "graphex" / "fb"
    committed = os.path.join(ROOT, "graphex", "fb")
    names = sorted(p.name for p in generated.iterdir())
    assert names == sorted(os.listdir(committed)) or names == sorted(
        n for n in os.listdir(committed) if n != "__pycache__")
    for name in names:
        with open(os.path.join(committed, name), "rb") as f:
            assert f.read() == (generated / name).read_bytes(), f"graphex/fb/{name} is stale: run `make schema`"
