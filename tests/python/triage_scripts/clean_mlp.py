"""A clean model: one graph, no recompiles, no copies, bitwise equal to eager at every stage."""

import torch


class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4))

    def forward(self, x):
        return self.net(x).softmax(-1)


def infer_one_step():
    torch.manual_seed(0)
    model = MLP().eval()
    compiled_model = torch.compile(model, backend="graphex", fullgraph=True, dynamic=False)
    dummy_input = torch.randn(8, 16)
    with torch.no_grad():
        for _ in range(3):
            output = compiled_model(dummy_input)
    assert output.shape == (8, 4)


if __name__ == "__main__":
    infer_one_step()
