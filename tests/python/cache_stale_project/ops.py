import torch

lib = torch.library.Library("cachestale", "DEF")
lib.define("twice(Tensor x) -> Tensor")


def twice_cpu(x):
    return x * 2


def twice_meta(x):
    return torch.empty_like(x)


lib.impl("twice", twice_cpu, "CPU")
lib.impl("twice", twice_meta, "Meta")
