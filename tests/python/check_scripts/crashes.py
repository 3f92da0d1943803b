"""The script itself fails in eager (graphex check exits 2, shows the traceback, checks the call made before)."""

import torch


@torch.library.custom_op("chk_crash::mm", mutates_args=(), device_types="cpu")
def mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return a @ b


@mm.register_fake
def _(a, b):
    return a.new_empty((a.shape[0], b.shape[1]))


def main():
    return mm(torch.randn(2, 3), torch.randn(3, 5)) + mm(torch.randn(2, 3), torch.randn(4, 5))  # the 2nd: shapes do not agree


if __name__ == "__main__":
    main()
