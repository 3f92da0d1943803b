"""The code generators behind `graphex new` (the command itself is graphex/tools/new.py).

    styles.py       the registration styles (no torch)
    plan.py         which files each command writes (and the Meta skeleton for an existing op)
    spec.py         parse and check the op's schema (torch._C.parse_schema) into an OpSpec
    (graphex/custom_ops/typemap.py: schema type -> Python annotation, C++ type, sample value; the library's fixes use it too)
    placeholder.py  the trivial kernel bodies and fake functions every generated op starts with
    text.py         small text helpers: signatures that wrap, string literals
    pystyles.py     the registration module for --style custom_op and --style library
    cppstyle.py     --style cpp: the C++ source and the Python module that builds and loads it
    usage.py        the reproducer (repro.py) and the pytest file (test_NAME.py) for an op
    mre.py          `graphex new mre`: the standard and the compile-cache reproducer templates
    files.py        write the files: refuse to overwrite, each write atomic
    prompts.py      `graphex new` on a terminal: the questions of the custom-op guide
"""

from __future__ import annotations

from typing import Any

__all__ = ["OpSpec", "SkeletonError", "parse_op"]


def __getattr__(name: str) -> Any:
    """spec.py imports torch: loaded on first use, so that `graphex --help` stays fast."""
    if name in __all__:
        from . import spec
        return getattr(spec, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
