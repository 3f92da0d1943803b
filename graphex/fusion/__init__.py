"""Fused mode (option pattern_fusion_pass): subgraphs of the functional ATen graph replaced by fused ops.

    manager.py        the pass: one torch pattern-matcher pass holding the built-in and the users'
                      patterns, run once per captured graph, counting what fired
    spellings.py      one spelling of the arguments the patterns read (transpose, softmax dims, _to_copy), set
                      before matching
    checks.py         the fused kernels' dtypes (one definition) and the match checks built on them
    patterns.py       the built-in patterns (RMSNorm, add + RMSNorm, add + LayerNorm, SiLU-gated MLP, rotary
                      embedding, one-row linear layers) and the groups they are traced in
    attention_patterns.py  the attention forms, one query token and many (Note [Attention forms are generated from
                      one table], Note [Which attention forms a prefill fuses])
    registration.py   graphex.register_replacement, npugraph_ex's API for users' patterns
    serialized/       the built-ins' search graphs traced once per torch minor version and shipped as Python source,
                      so a process registers them without tracing (Note [Built-in patterns ship as traced graphs])
    chains.py         chains of element-wise ops, found by rule and run as one graphex_fused::pointwise (after
                      the patterns, CSE; option pointwise_fusion)
    pooling.py        max pooling whose indices nothing reads, as graphex_fused::max_pool2d (bit for bit)
    batch_norm.py     inference batch norm as a per-channel multiply and add, for the chains to fuse (option
                      pointwise_fusion)
    conv_layout.py    2-d convolutions and the ops between them in channels_last order (option channels_last_conv)

The fused ops are graphex_fused::* (csrc/fused/), C++ kernels of ours, close to eager but not
bitwise (Note [Fused kernels are close, not bitwise] in csrc/fused/library.cpp).
"""

from __future__ import annotations

from ..base.lazy import lazy_names

# Imported on first use (PEP 562): a process that only reads the compile cache needs manager.registered_patterns,
# and registration.py imports inductor's pattern matcher (most of a second) at once.
_PUBLIC = {"run_fusion": "manager", "say_if_nothing_fused": "manager", "register_replacement": "registration"}
__all__ = list(_PUBLIC)


__getattr__ = lazy_names(__name__, _PUBLIC)
