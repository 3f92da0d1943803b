import torch


class TinyMLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(16, 32)
        self.fc2 = torch.nn.Linear(32, 16)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


def infer_one_step():
    """
    A two-layer MLP, one inference step on the npugraph_ex backend (graphex on the CPU).

    关键配置：
    - backend="npugraph_ex" — Capture & Replay，任务下沉 Device，降低 Host 调度开销
    - fullgraph=True — 整图捕获，不允许断图
    - dynamic=False — 固定 shape（npugraph_ex底层调用的aclgraph不支持动态 shape，开启dynamic=True执行过程中可能会有多张aclgraph）
    """
    model = TinyMLP().cpu().eval()
    compiled_model = torch.compile(
        model,
        backend="npugraph_ex",
        fullgraph=True,
        dynamic=False,
    )
    dummy_input = torch.randn(4, 16).cpu()
    output = compiled_model(dummy_input)
    return model, dummy_input, output  # (not in the template: lets the test compare with eager)


if __name__ == "__main__":
    infer_one_step()
