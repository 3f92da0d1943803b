import torch

SCALE = 2.0
ACT = torch.relu
