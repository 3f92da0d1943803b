"""The registration styles `graphex new op --style` offers (no torch: `graphex --help` reads it)."""

STYLES = {
    "custom_op": "@torch.library.custom_op in Python; the fake function via @op.register_fake, same file",
    "library": 'torch.library.Library(ns, "FRAGMENT") + define + @impl(lib, op, "CPU"); '
               'Meta via Library(ns, "IMPL", "Meta")',
    "cpp": "TORCH_LIBRARY + C++ CPU and Meta kernels, built on import (the op-plugin path)",
}
