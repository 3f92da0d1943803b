"""The two op-plugin blocks of the template pasted one after the other, as the template says to.

The second `m = Library("npu", "IMPL", "Meta")` rebinds `m`: the first Library is garbage-collected
and takes my_op's Meta function with it. Compiling then fails with graphex's missing-fake error,
which says so (Note [A Meta registration that vanished]); op_plugin.py is the working version.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _op_plugin_kernels  # noqa: E402,F401  (not in the template: the kernels torch_npu would provide)

import torch
from torch.library import Library, impl

# 对应 op_plugin_functions.yaml 中的 schema：
# custom:
#   - func: my_op(Tensor x, Tensor? y, Tensor[] z, float attr1, int attr2) -> Tensor

m = Library("npu", "IMPL", "Meta")

@impl(m, "my_op")
def my_op_meta(x, y, z, attr1, attr2):
    # <根据算子语义推导输出 shape/dtype>
    return torch.empty_like(x)

# 调用方式：torch.ops.npu.my_op(x, y, z, attr1, attr2)

import torch
from torch.library import Library, impl

# 对应 op_plugin_functions.yaml 中的 schema：
# custom:
#   - func: my_inplace(Tensor(a!) x, Tensor y) -> Tensor

m = Library("npu", "IMPL", "Meta")

@impl(m, "my_inplace")
def my_inplace_meta(x, y):
    # 输出 shape/dtype 与 y 相同；不返回被修改的输入 x
    return torch.empty_like(y)

# 调用方式：torch.ops.npu.my_inplace(x, y)


class Model(torch.nn.Module):
    def forward(self, x):
        y = torch.ops.npu.my_op(x, None, [x], 2.0, 1)
        return torch.ops.npu.my_inplace(x, y)


def infer_one_step():
    model = Model().cpu().eval()
    compiled_model = torch.compile(model, backend="npugraph_ex", fullgraph=True, dynamic=False)
    dummy_input = torch.randn(4, 8).cpu()
    output = compiled_model(dummy_input)
    return output


if __name__ == "__main__":
    infer_one_step()
