"""One-time warnings: each distinct message key is reported once per process."""

from __future__ import annotations

import warnings

from . import _log

_seen: set[str] = set()


class GraphexWarning(UserWarning):
    """Category of every warning graphex emits (filter with warnings.filterwarnings)."""


def warn_once(key: str, message: str) -> None:
    if key in _seen:
        return
    _seen.add(key)
    _log.info("%s", message)
    warnings.warn(message, GraphexWarning, stacklevel=3)


def reset() -> None:
    """Forget which warnings were shown (tests)."""
    _seen.clear()
