"""graphex-run (C++, no Python): runs an exported artifact on a safetensors file of inputs and writes
the flattened result as safetensors; its output is bitwise equal to eager (one subprocess test)."""

import os
import subprocess

import pytest
import torch

import graphex
from graphex.exporting import load_safetensors, safetensors_bytes

from conftest import ROOT

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
