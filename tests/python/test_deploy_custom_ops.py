"""Custom operators in deployment (Note [An artifact holds no Python operator], graphex/exporting.py;
Note [Load names every missing operator at once], csrc/deploy/module.cpp): C++ TORCH_LIBRARY operators
run in graphex-run with --load-library; without it, loading names every missing operator and the fix;
an operator defined in Python is refused at export, named, with how to make it deployable."""

import os
import subprocess

import pytest
import torch

import graphex
from graphex.exporting import ExportError, load_safetensors, safetensors_bytes
from examples import ops
from examples.models.decoder import DecoderConfig, build_decoder

from conftest import ROOT

GRAPHEX_RUN = os.path.join(os.environ.get("GRAPHEX_BUILD_DIR") or os.path.join(ROOT, "build", "py"), "graphex-run")
SMALL = DecoderConfig(vocab_size=64, hidden=32, heads=2, layers=2, intermediate=64, max_positions=16, custom_ops=True)


@torch.library.custom_op("graphex_test_deploy::twice", mutates_args=())
def twice(x: torch.Tensor) -> torch.Tensor:
    return x * 2


@twice.register_fake
def _(x):
    return torch.empty_like(x)


def test_an_operator_defined_in_python_is_refused_at_export_with_the_fix(tmp_path):
    def f(x):
        return twice(x + 1).relu()

    with pytest.raises(ExportError) as info:
        graphex.export(f, (torch.randn(3),), tmp_path / "py.graphex")
    finding = info.value.finding
    assert finding.op == "graphex_test_deploy::twice"
    assert "graphex_test_deploy::twice" in finding.what and "defined in Python" in finding.what
    assert "test_deploy_custom_ops.py" in finding.where  # the user's line that called it
    assert "TORCH_LIBRARY" in finding.fix and "graphex new op NS::NAME --style cpp" in finding.fix
    assert "--load-library" in finding.fix
    assert not (tmp_path / "py.graphex" / "program.gxp").exists()


def test_cpp_custom_operators_run_in_graphex_run_with_load_library(tmp_path):
    assert os.path.exists(GRAPHEX_RUN), "graphex-run is not built (make build)"
    model = build_decoder(SMALL, seed=3)  # loads libgraphex_example_ops.so in this process
    k, v = model.new_cache()
    tokens, pos = torch.tensor([[5]]), torch.tensor([0])
    path = graphex.export(model, (tokens, pos, k.clone(), v.clone()), tmp_path / "dec.graphex")
    (tmp_path / "in.safetensors").write_bytes(safetensors_bytes({"0": tokens, "1": pos, "2": k, "3": v}))
    with torch.no_grad():
        expected = model(tokens, pos, k.clone(), v.clone())

    # Without the library: one error naming every operator the process lacks, and the fix.
    proc = subprocess.run([GRAPHEX_RUN, path, "--inputs", str(tmp_path / "in.safetensors")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1
    assert "3 operators this process does not have: graphex_examples::rms_norm, graphex_examples::rotary_embedding, " \
           "graphex_examples::kv_cache_update_" in proc.stderr, proc.stderr
    assert "pass --load-library path/to/lib.so to graphex-run, or link it into your program" in proc.stderr

    # The fix, applied: bitwise equal to eager.
    out = tmp_path / "out.safetensors"
    proc = subprocess.run([GRAPHEX_RUN, path, "--inputs", str(tmp_path / "in.safetensors"), "--output", str(out),
                           "--load-library", str(ops.library_path())], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert torch.equal(load_safetensors(out)["0"], expected)
