"""Recompiles: a Python int that changes every call, then a new input shape, under dynamic=False.

Dynamo specializes on the value of an int argument and (with dynamic=False) on every size,
so each new value or shape compiles and captures the graph again.
"""

import torch


def scaled(x, steps: int):
    return x * steps + 1


def infer_one_step():
    compiled = torch.compile(scaled, backend="graphex", fullgraph=True, dynamic=False)
    x = torch.randn(4, 8)
    for steps in (1, 2, 3):
        compiled(x, steps)  # a new int each call
    compiled(torch.randn(6, 8), 3)  # a new shape


if __name__ == "__main__":
    infer_one_step()
