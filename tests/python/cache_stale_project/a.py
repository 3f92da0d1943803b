"""Run as a script (module __main__), like b.py: the same class and method name, another body."""
import torch

import graphex
import scenarios


class Model(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.cached_forward = graphex.inference.cache_compile(self._forward)  # the default cache dir

    def forward(self, x):
        return self.cached_forward(x)

    def _forward(self, x):
        return torch.relu(x) + 1


scenarios.main(Model())
