"""A print() inside the compiled function: one graph break (the script compiles with fullgraph=True)."""

import torch


def step(x, w):
    y = x @ w
    print("debug: y has shape", y.shape)  # Dynamo cannot trace print
    return torch.relu(y)


def infer_one_step():
    torch.manual_seed(0)
    compiled = torch.compile(step, backend="graphex", fullgraph=True, dynamic=False)
    x, w = torch.randn(4, 8), torch.randn(8, 8)
    output = compiled(x, w)
    assert torch.equal(output, step(x, w))


if __name__ == "__main__":
    infer_one_step()
