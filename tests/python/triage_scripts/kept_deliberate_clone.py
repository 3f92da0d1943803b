"""A copy the user asks for: bump a clone of x with an in-place custom op, then read x as it was.

The replay keeps one copy, the one `x.clone()` asks for; that is a note, not a problem (exit 0).
"""

import torch


@torch.library.custom_op("triage_clone::bump_", mutates_args=("x",))
def bump_(x: torch.Tensor) -> None:
    x.add_(1)


@bump_.register_fake
def _(x):
    return None


def step(x):
    y = x.clone()  # keep x as it was: bump a copy
    bump_(y)
    return y * x


def infer_one_step():
    compiled = torch.compile(step, backend="graphex", fullgraph=True, dynamic=False)
    with torch.no_grad():
        compiled(torch.randn(4, 8))


if __name__ == "__main__":
    infer_one_step()
