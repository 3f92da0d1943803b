"""Write the artifacts tests/cpp/test_deploy.cpp loads (run by ctest as a fixture: python make_artifacts.py DIR).

For each case NAME: DIR/NAME/ (graphex.export), DIR/NAME.inputs.safetensors (the positional inputs
"0", "1", ...) and DIR/NAME.expected.safetensors (eager's flattened result, tensor leaves by position).
The inputs differ from the example inputs the export saw (other values; other sizes when dynamic).
"""

import os
import sys

import torch

import graphex
from graphex.exporting import safetensors_bytes


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = torch.nn.LayerNorm(16)
        self.fc = torch.nn.Linear(16, 16)
        self.register_buffer("bias2", torch.linspace(-1, 1, 16))

    def forward(self, x, y):
        h = torch.nn.functional.gelu(self.fc(self.norm(x))) + self.bias2
        return h.softmax(-1), (h * y).sum(-1)


def _write(out_dir, name, model, example, inputs, dynamic):
    graphex.export(model, example, os.path.join(out_dir, name), dynamic=dynamic)
    with torch.no_grad():
        result = model(*inputs)
    leaves = [v for v in torch.utils._pytree.tree_leaves(result)]
    with open(os.path.join(out_dir, f"{name}.inputs.safetensors"), "wb") as f:
        f.write(safetensors_bytes({str(i): t for i, t in enumerate(inputs)}))
    with open(os.path.join(out_dir, f"{name}.expected.safetensors"), "wb") as f:
        f.write(safetensors_bytes({str(i): t for i, t in enumerate(leaves) if isinstance(t, torch.Tensor)}))


def main(out_dir: str) -> None:
    os.makedirs(out_dir, exist_ok=True)
    torch.manual_seed(0)
    model = Block().eval()
    example = (torch.randn(4, 16), torch.randn(4, 16))
    _write(out_dir, "static", model, example, (torch.randn(4, 16), torch.randn(4, 16)), dynamic=False)
    _write(out_dir, "dynamic", model, example, (torch.randn(7, 16), torch.randn(7, 16)), dynamic=True)


if __name__ == "__main__":
    main(sys.argv[1])
