"""torch.cond compiles in Dynamo, but graphex's engine cannot replay a higher-order op: a CaptureError."""

import torch


def clip(x):
    return torch.cond(x.sum() > 0, lambda t: t.clamp(max=1.0), lambda t: t.clamp(min=-1.0), (x,))


def infer_one_step():
    compiled = torch.compile(clip, backend="graphex", fullgraph=True, dynamic=False)
    with torch.no_grad():
        compiled(torch.randn(8))


if __name__ == "__main__":
    infer_one_step()
