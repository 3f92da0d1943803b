"""A correct decode step whose state lives outside its tensor arguments: a KV-cache object passed
in and updated in place, and a step counter kept as a plain tensor attribute of the module.

The script calls the step three times, so after it ran the cache holds three steps. Triage must
put all of it back as it was before the first call for every rerun, or eager itself looks
nondeterministic and the bisection stops.
"""

import torch


class KVCache:
    def __init__(self, batch: int, length: int, dim: int):
        self.k = torch.zeros(batch, length, dim)
        self.v = torch.zeros(batch, length, dim)
        self.length = torch.zeros(1, dtype=torch.long)  # how many positions are filled


class Decoder(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv = torch.nn.Linear(16, 48)
        self.steps = torch.zeros(())  # a counter that is not a registered buffer

    def forward(self, x, cache):
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        cache.k.index_copy_(1, cache.length, k)
        cache.v.index_copy_(1, cache.length, v)
        cache.length += 1
        self.steps += 1
        scores = (cache.k * q).sum(-1, keepdim=True).softmax(1)
        return (scores * cache.v).sum(1) * self.steps


def infer_one_step():
    torch.manual_seed(0)
    model = Decoder().eval()
    compiled_model = torch.compile(model, backend="graphex", fullgraph=True, dynamic=False)
    cache = KVCache(2, 8, 16)
    with torch.no_grad():
        for _ in range(3):
            compiled_model(torch.randn(2, 1, 16), cache)


if __name__ == "__main__":
    infer_one_step()
