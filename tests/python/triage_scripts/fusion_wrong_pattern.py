"""A wrong result that only fused mode gives (bisection: stage force_eager, pass pattern_fusion_pass).

The script registers its own fused pattern with graphex.register_replacement, and its fused
kernel is deliberately wrong (tanh(x) * y + 1 for tanh(x) * y). Eager and aot_eager never use
it; with options={"pattern_fusion_pass": True} every stage after the passes differs by 1, and
switching pattern fusion off is what brings eager's result back.
"""

import torch

import graphex


@torch.library.custom_op("triage_wrongfusion::tanh_mul", mutates_args=())
def tanh_mul(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return torch.tanh(x) * y + 1  # deliberately wrong: the pattern it replaces has no + 1


@tanh_mul.register_fake
def _(x, y):
    return torch.empty_like(x)


def search(x, y):
    return torch.tanh(x) * y


def replace(x, y):
    return torch.ops.triage_wrongfusion.tanh_mul(x, y)


graphex.register_replacement(search, replace, [torch.randn(4, 4), torch.randn(4, 4)])


def step(a, b):
    h = torch.tanh(a) * b
    return h + h  # a second reader of h: CSE and reinplacing have something to do, and are not the cause


def infer_one_step():
    torch.manual_seed(0)
    compiled = torch.compile(step, backend="graphex", fullgraph=True, dynamic=False,
                             options={"pattern_fusion_pass": True})
    with torch.no_grad():
        compiled(torch.randn(4, 8), torch.randn(4, 8))


if __name__ == "__main__":
    infer_one_step()
