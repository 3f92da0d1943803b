"""`graphex.npugraph_ex.inference.cache_compile`: the path the npugraph_ex templates use
(`torch.npu.npugraph_ex.inference.cache_compile`), so a template needs only its prefix changed.
It is graphex.inference itself (README: "The npugraph_ex templates on the CPU"). Likewise
`graphex.npugraph_ex.register_replacement` is graphex.register_replacement (fused mode).
"""

from . import inference
from .fusion import register_replacement

__all__ = ["inference", "register_replacement"]
