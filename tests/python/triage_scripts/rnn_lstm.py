"""An LSTM: Dynamo refuses RNN / GRU / LSTM unless torch._dynamo.config.allow_rnn = True."""

import torch


class Tagger(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.rnn = torch.nn.LSTM(8, 16, batch_first=True)
        self.head = torch.nn.Linear(16, 4)

    def forward(self, x):
        h, _ = self.rnn(x)
        return self.head(h)


def infer_one_step():
    torch.manual_seed(0)
    model = Tagger().eval()
    compiled_model = torch.compile(model, backend="graphex", fullgraph=True, dynamic=False)
    with torch.no_grad():
        compiled_model(torch.randn(2, 5, 8))


if __name__ == "__main__":
    infer_one_step()
