"""A decode position passed as a tensor and used as an index: a compiled graph cannot take a
slice bound or an index from tensor data (GuardOnDataDependentSymNode).

The fix triage prints: pass the position as a Python int and mark it dynamic
(torch.compiler.config.dynamic_sources); the test applies it and triages again.
"""

import torch


def attend(q, cache, pos):
    window = cache[:, : pos + 1]  # keys up to this position
    scores = (window * q.unsqueeze(1)).sum(-1).softmax(-1)
    return (scores.unsqueeze(-1) * window).sum(1) + cache[:, pos]


def infer_one_step():
    torch.manual_seed(0)
    compiled = torch.compile(attend, backend="graphex", fullgraph=True, dynamic=False)
    cache = torch.randn(2, 16, 8)
    with torch.no_grad():
        for pos in range(2, 6):
            q = torch.randn(2, 8)
            out = compiled(q, cache, torch.tensor(pos))
            assert torch.equal(out, attend(q, cache, pos))


if __name__ == "__main__":
    infer_one_step()
