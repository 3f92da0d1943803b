"""A decode loop compiled with dynamic=True whose position still recompiles: `cache[:, pos] = x`
makes Dynamo specialize the int. Triage must not advise dynamic=True again, but the rewrite.
"""

import torch


def step(x, cache, pos: int):
    cache[:, pos] = x  # an int index: Dynamo guards on its value
    return cache[:, : pos + 1].sum(1)


def infer_one_step():
    compiled = torch.compile(step, backend="graphex", fullgraph=True, dynamic=True)
    cache, expected = torch.zeros(2, 16, 8), torch.zeros(2, 16, 8)
    with torch.no_grad():
        for pos in range(6):
            x = torch.randn(2, 8)
            assert torch.equal(compiled(x, cache, pos), step(x, expected, pos))


if __name__ == "__main__":
    infer_one_step()
