"""`graphex.npugraph_ex.inference.cache_compile`: the path the npugraph_ex templates use
(`torch.npu.npugraph_ex.inference.cache_compile`), so a template needs only its prefix changed.
It is graphex.inference itself (docs/npugraph-ex.md). Likewise
`graphex.npugraph_ex.register_replacement` is graphex.register_replacement (fused mode), and
`graphex.npugraph_ex.compile_fx` is graphex.compile_fx (for a backend that runs AOTAutograd itself).
"""

from . import inference
from .backend import compile_fx
from .fusion import register_replacement

__all__ = ["compile_fx", "inference", "register_replacement"]
