"""A package's public names, imported from their modules on first use (PEP 562)."""

from __future__ import annotations

import importlib
import sys
from typing import Any, Callable


def lazy_names(package: str, table: dict[str, str]) -> Callable[[str], Any]:
    """The module `__getattr__` of `package` for `table` (public name -> the submodule that defines it): the name is
    imported at its first use and kept in the package's globals, so later reads cost nothing. graphex.fusion and
    graphex.custom_ops use it so that a process that only replays cache entries imports neither inductor's pattern
    matcher nor Dynamo (Note [A cache hit imports no compiler])."""

    def __getattr__(name: str) -> Any:
        if name not in table:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f".{table[name]}", package), name)
        setattr(sys.modules[package], name, value)
        return value

    return __getattr__
