"""An accuracy problem that appears only after graphex's passes (bisection stage: force_eager).

`bump` is declared functional (mutates_args=()) but its kernel also adds 1 to its input in
place. The model calls it on a clone, so in eager (and under aot_eager, which runs the same
graph) only the clone is bumped. graphex's remove_noop_ops pass trusts the schema: the clone
has no other reader, so it is dropped as a no-op, and the kernel then bumps `y` itself, which
the model returns. The fix is in the op, not in graphex: declare mutates_args=("x",).
"""

import torch


@torch.library.custom_op("triage_lyingschema::bump", mutates_args=())
def bump(x: torch.Tensor) -> torch.Tensor:
    x.add_(1)  # undeclared write to an input
    return x.sum(-1, keepdim=True)


@bump.register_fake
def _(x):
    return x.new_empty(x.shape[:-1] + (1,))


def step(x):
    y = x * 2
    s = bump(y.clone())
    return y + s


def infer_one_step():
    torch.manual_seed(0)
    compiled = torch.compile(step, backend="graphex", fullgraph=True, dynamic=False)
    with torch.no_grad():
        compiled(torch.randn(4, 8))


if __name__ == "__main__":
    infer_one_step()
