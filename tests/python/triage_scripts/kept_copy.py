"""A KV-cache update that keeps a full copy: the script turns off input_inplace_pass.

`cache.index_copy_(...)` on a graph input is functionalized into "index_copy + copy_ back";
graphex folds that back into the in-place op unless options={'input_inplace_pass': False}.
"""

import torch


class Decoder(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(16, 16)

    def forward(self, x, cache, pos):
        k = self.proj(x)
        cache.index_copy_(1, pos, k)  # write this step's keys into the cache
        return cache.sum(1)


def infer_one_step():
    torch.manual_seed(0)
    model = Decoder().eval()
    compiled_model = torch.compile(model, backend="graphex", fullgraph=True, dynamic=False,
                                   options={"input_inplace_pass": False})
    cache = torch.zeros(2, 32, 16)
    with torch.no_grad():
        for step in range(3):
            compiled_model(torch.randn(2, 1, 16), cache, torch.tensor([step]))


if __name__ == "__main__":
    infer_one_step()
