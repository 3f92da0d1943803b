"""Two graph breaks in one forward: a data-dependent `if` and a `.item()`.

fullgraph=True stops at the first one; triage re-traces with fullgraph=False to list both.
"""

import torch


class Gate(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)

    def forward(self, x):
        h = self.fc(x)
        if h.sum() > 0:  # data-dependent control flow
            h = h * 2
        scale = h.abs().max().item()  # a Python float out of a tensor
        return h / scale


def infer_one_step():
    torch.manual_seed(0)
    model = Gate().eval()
    compiled_model = torch.compile(model, backend="graphex", fullgraph=True, dynamic=False)
    dummy_input = torch.randn(4, 8)
    with torch.no_grad():
        output = compiled_model(dummy_input)
    print(output.shape)


if __name__ == "__main__":
    infer_one_step()
