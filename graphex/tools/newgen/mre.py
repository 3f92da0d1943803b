'''`graphex new mre`: the npugraph_ex reproducer templates, for graphex on CPU.

Both keep the template's three parts (imports, `def infer_one_step()`,
`if __name__ == "__main__"`) and its fixed names. They run as written: the placeholder
model (marked `<your ...>`) is a Linear and a ReLU.
'''

from __future__ import annotations

_STANDARD = '''\
"""Minimal reproducer for graphex: put your model in Model, then run python repro.py."""

import torch

import graphex  # noqa: F401  (registers backend="graphex")


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(8, 8)  # <your layers>

    def forward(self, x):
        return torch.relu(self.linear(x))  # <your forward>


def infer_one_step():
    """
    <what this reproduces, in one sentence>

    Key settings:
    - backend="graphex" — capture the ATen graph once, replay it from C++ with no Python per op
    - fullgraph=True — the forward is one graph: a graph break is an error, not a silent fallback
    - dynamic=False — fixed shapes: a new input shape compiles a new graph
    - <other settings that matter> — <what they do>
    """
    model = Model().eval()
    compiled_model = torch.compile(
        model,
        backend="graphex",
        fullgraph=True,
        dynamic=False,
    )
    dummy_input = torch.randn(4, 8)  # <your input shape>
    with torch.no_grad():
        output = compiled_model(dummy_input)
        expected = model(dummy_input)
    # graphex replays eager's kernels: anything but an exact match is worth reporting.
    print(f"output {tuple(output.shape)} {output.dtype}; "
          f"{'matches eager exactly' if torch.equal(output, expected) else 'DIFFERS FROM EAGER'}")


if __name__ == "__main__":
    infer_one_step()
'''

_CACHE = '''\
"""Minimal reproducer for graphex's compile cache: run python repro_cache.py twice.

The first run compiles and saves the graph; the second loads it and skips Dynamo.
"""

import torch

import graphex.inference


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(8, 8)  # <your layers>
        self.cached_forward = graphex.inference.cache_compile(
            self._forward,
            dynamic=False,
            # cache_dir=".graphex_cache",  # optional: where the compiled graph is kept
        )

    def forward(self, dummy_input):
        """
        <what this reproduces, in one sentence>

        Key settings:
        - graphex.inference.cache_compile — instead of torch.compile: saves the compiled graph to disk
          and loads it in later runs
        - dynamic=False — fixed shapes: a new input shape compiles (and saves) a new graph
        - cache_dir — where the cache lives, by default .graphex_cache
        - <other settings that matter> — <what they do>
        """
        return self.cached_forward(dummy_input)

    def _forward(self, dummy_input):
        return torch.relu(self.linear(dummy_input))  # <your forward>


def infer_one_step():
    model = Model().eval()
    dummy_input = torch.randn(4, 8)  # <your input shape>
    with torch.no_grad():
        output = model(dummy_input)
        expected = model._forward(dummy_input)
    print(f"output {tuple(output.shape)} {output.dtype}; "
          f"{'matches eager exactly' if torch.equal(output, expected) else 'DIFFERS FROM EAGER'}")


if __name__ == "__main__":
    infer_one_step()
'''


def standard_template() -> str:
    return _STANDARD


def cache_template() -> str:
    return _CACHE
