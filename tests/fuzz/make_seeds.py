"""Seeds for fuzz_load.cpp (tests/fuzz/corpus/): small exported artifacts in the fuzzer's input layout
(u32 program size, program.gxp, weights.safetensors). Run once; the corpus is kept in the repository.

    .venv/bin/python tests/fuzz/make_seeds.py tests/fuzz/corpus
"""

import os
import struct
import sys
import tempfile

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

import graphex  # noqa: E402


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 3)
        self.register_buffer("scale", torch.tensor([0.5, 2.0, 1.0]))

    def forward(self, x):
        return {"y": torch.relu(self.fc(x)) * self.scale, "n": 3}


def seed(model, args, dynamic=False) -> bytes:
    with tempfile.TemporaryDirectory() as d:
        path = graphex.export(model, args, os.path.join(d, "a"), dynamic=dynamic)
        program = open(os.path.join(path, "program.gxp"), "rb").read()
        weights = open(os.path.join(path, "weights.safetensors"), "rb").read()
    return struct.pack("<I", len(program)) + program + weights


def fn(x, y):
    return (x * y).sum(-1), x.t().contiguous()


def main(out: str) -> None:
    os.makedirs(out, exist_ok=True)
    torch.manual_seed(0)
    seeds = {"net_static": seed(Net().eval(), (torch.randn(2, 4),)),
             # dynamic: a function whose outputs are tensors only (export refuses a Python int that may come from a size)
             "fn_dynamic": seed(fn, (torch.randn(3, 5), torch.randn(3, 5)), dynamic=True),
             "fn_no_weights": seed(fn, (torch.randn(3, 5), torch.randn(3, 5)))}
    for name, data in seeds.items():
        with open(os.path.join(out, name), "wb") as f:
            f.write(data)
        print(name, len(data))


if __name__ == "__main__":
    main(sys.argv[1])
