"""The program: the typed form lowering produces (`typed`) and the one encoder that writes it (`encode`).

    lowering/lower.py ─► typed.Program ─► encode.encode ─► bytes (csrc/schema/program.fbs) ─► C++ (format.cpp)

See Note [One typed program] (typed.py). The FlatBuffers code the encoder calls is graphex/fb/, generated
from the schema; its package name is the schema's namespace (`graphex.fb`, also C++'s `graphex::fb`).
"""

from .typed import (  # noqa: F401
    Binding,
    BindingKind,
    Const,
    GetItemNode,
    HELD_KINDS,
    Input,
    InputKind,
    Leaf,
    LeafKind,
    Node,
    OpNode,
    Program,
    Slot,
    SymNode,
    TensorMeta,
    Value,
)
