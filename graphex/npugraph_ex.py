"""`graphex.npugraph_ex.inference.cache_compile`: the path the npugraph_ex templates use
(`torch.npu.npugraph_ex.inference.cache_compile`), so a template needs only its prefix changed.
It is graphex.inference itself (README: "The npugraph_ex templates on the CPU").
"""

from . import inference

__all__ = ["inference"]
