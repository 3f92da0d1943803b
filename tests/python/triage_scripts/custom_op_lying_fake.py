"""A custom op whose fake lies about the output shape: the kernel reduces the last dim, the fake keeps it.

graphex checks each custom op's real outputs against its fake on the first replay
(option validate_fake) and raises a CustomOpError naming the op.
"""

import torch


@torch.library.custom_op("triage_lyingfake::row_norm", mutates_args=())
def row_norm(x: torch.Tensor) -> torch.Tensor:
    return x.norm(dim=-1)


@row_norm.register_fake
def _(x):
    return torch.empty_like(x)  # wrong: the kernel returns x.shape[:-1]


def infer_one_step():
    compiled = torch.compile(lambda x: row_norm(x) * 2, backend="graphex", fullgraph=True, dynamic=False)
    with torch.no_grad():
        compiled(torch.randn(4, 8))


if __name__ == "__main__":
    infer_one_step()
