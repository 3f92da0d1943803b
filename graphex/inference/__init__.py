"""graphex.inference: inference helpers. `cache_compile` is a persistent compile cache (see cache_compile.py)."""

from .cache_compile import DEFAULT_DIR, CachedFunction, cache_compile

__all__ = ["cache_compile", "CachedFunction", "DEFAULT_DIR"]
