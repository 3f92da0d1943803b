"""A wrong kernel that only the C++ replay calls (bisection stage: replay; per-op step names it).

`triage_plant::scale` has a correct Autograd-key kernel and a wrong CPU kernel (it forgets the
factor). In eager, even under torch.no_grad(), a real tensor dispatches through the Autograd key,
so eager, aot_eager and force_eager (torch.fx calls the op the same way) are all right; the engine
excludes the autograd keys under no_grad and calls the CPU kernel directly. The op sits deep inside
the model: triage's per-op step (data dumps of the original and the optimized graph) names it as
the first op whose output differs.
"""

import torch

lib = torch.library.Library("triage_plant", "DEF")
lib.define("scale(Tensor x, float factor) -> Tensor")


def _autograd(x, factor):
    if type(x) is torch.Tensor:  # a real tensor: eager's path, right
        return x * factor
    with torch._C._AutoDispatchBelowAutograd():  # being traced: keep the op in the graph
        return torch.ops.triage_plant.scale(x, factor)


def _cpu(x, factor):
    return x.clone()  # wrong: forgets the factor


lib.impl("scale", _autograd, "Autograd")
lib.impl("scale", _cpu, "CPU")
lib.impl("scale", lambda x, factor: torch.empty_like(x), "Meta")


class Block(torch.nn.Module):
    def __init__(self, scaled: bool):
        super().__init__()
        self.linear = torch.nn.Linear(16, 16)
        self.scaled = scaled

    def forward(self, x):
        h = torch.nn.functional.gelu(self.linear(x))
        if self.scaled:
            h = torch.ops.triage_plant.scale(h, 0.5)
        return x + h


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = torch.nn.ModuleList([Block(scaled=(i == 2)) for i in range(4)])
        self.head = torch.nn.Linear(16, 4)

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def infer_one_step():
    torch.manual_seed(0)
    model = Model().eval()
    compiled = torch.compile(model, backend="graphex", fullgraph=True, dynamic=False)
    with torch.no_grad():
        compiled(torch.randn(3, 16))


if __name__ == "__main__":
    infer_one_step()
