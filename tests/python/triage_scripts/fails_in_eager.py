"""A script that is broken before graphex is involved: the model's shapes do not fit (exit code 2).

With the argument --fixed it feeds the right shape and runs cleanly (tests pass arguments after --).
"""

import sys

import torch


def infer_one_step():
    model = torch.nn.Linear(16, 4).eval()
    compiled_model = torch.compile(model, backend="graphex", fullgraph=True, dynamic=False)
    with torch.no_grad():
        features = 16 if "--fixed" in sys.argv[1:] else 8
        compiled_model(torch.randn(2, features))  # 8 features into a Linear(16, ...) fails


if __name__ == "__main__":
    infer_one_step()
