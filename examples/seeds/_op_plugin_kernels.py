"""Stand-in for what the op-plugin template leaves to the user (Ascend C kernels, op_plugin_functions.yaml,
a rebuilt torch_npu): the schemas and CPU kernels of npu::my_op and npu::my_inplace, from Python.
Not part of the template; the files next to this one import it first."""

import torch

_lib = torch.library.Library("npu", "FRAGMENT")
_lib.define("my_op(Tensor x, Tensor? y, Tensor[] z, float attr1, int attr2) -> Tensor")
_lib.define("my_inplace(Tensor(a!) x, Tensor y) -> Tensor")


@torch.library.impl(_lib, "my_op", "CPU")
def _my_op(x, y, z, attr1, attr2):
    out = x * attr1 + attr2
    if y is not None:
        out = out + y
    for t in z:
        out = out + t
    return out


@torch.library.impl(_lib, "my_inplace", "CPU")
def _my_inplace(x, y):
    x.add_(y)
    return y * 2
