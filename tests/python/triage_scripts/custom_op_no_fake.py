"""A custom op registered with torch.library.custom_op but no register_fake: it cannot be traced."""

import torch


@torch.library.custom_op("triage_nofake::scale_rows", mutates_args=())
def scale_rows(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return x * w.unsqueeze(-1)


class Model(torch.nn.Module):
    def forward(self, x, w):
        return torch.ops.triage_nofake.scale_rows(x, w).relu()


def infer_one_step():
    compiled_model = torch.compile(Model(), backend="graphex", fullgraph=True, dynamic=False)
    with torch.no_grad():
        compiled_model(torch.randn(4, 8), torch.randn(4))


if __name__ == "__main__":
    infer_one_step()
