import torch

import graphex.npugraph_ex  # noqa: F401  (the template's torch.npu.npugraph_ex, on the CPU)


class TinyMLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(16, 32)
        self.fc2 = torch.nn.Linear(32, 16)
        self.cached_forward = graphex.npugraph_ex.inference.cache_compile(
            self._forward,
            dynamic=False,
            # cache_dir=".torchair_cache",  # 可选，指定缓存路径
        )

    def forward(self, dummy_input):
        """
        A two-layer MLP through the compile cache.

        关键配置：
        - torch.npu.npugraph_ex.inference.cache_compile — 替代 torch.compile，缓存 Dynamo 编译结果
        - dynamic=False — 固定 shape（npugraph_ex底层调用的aclgraph不支持动态 shape，开启dynamic=True执行过程中可能会有多张aclgraph）
        - cache_dir — 缓存文件保存路径，默认 .torchair_cache
        """
        return self.cached_forward(dummy_input)

    def _forward(self, dummy_input):
        return self.fc2(torch.relu(self.fc1(dummy_input)))


def infer_one_step():
    model = TinyMLP().cpu().eval()
    dummy_input = torch.randn(4, 16).cpu()
    output = model(dummy_input)
    return model, dummy_input, output  # (not in the template: lets the test compare with eager)


if __name__ == "__main__":
    infer_one_step()
