"""Logging, switched on by the GRAPHEX_LOG environment variable.

GRAPHEX_LOG=1  one line per capture (graph id, ops, inputs, outputs, capture time)
               and every decision a user may want to know about (kept copies,
               fallbacks to eager, recompiles past capture_limit).
GRAPHEX_LOG=2  also per-op detail: each node of each captured graph as it is lowered.

Messages go to the "graphex" logger; with GRAPHEX_LOG set and no handler configured
by the application, they are printed to stderr prefixed with "[graphex]".
The variable is read at each capture, so it can be set after import.
"""

from __future__ import annotations

import logging
import os
import sys

logger = logging.getLogger("graphex")
_handler: logging.Handler | None = None


def verbosity() -> int:
    raw = os.environ.get("GRAPHEX_LOG", "0").strip()
    try:
        return int(raw)
    except ValueError:
        return 1 if raw.lower() in ("info", "true", "yes", "on") else 2 if raw.lower() == "debug" else 0


class _StderrHandler(logging.Handler):
    """Writes to whatever sys.stderr is at the time (it may have been redirected since import)."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            sys.stderr.write(self.format(record) + "\n")
        except Exception:  # a logging failure must never break a compile
            self.handleError(record)


def _ensure_handler() -> None:
    global _handler
    if _handler is None and not logger.handlers:
        _handler = _StderrHandler()
        _handler.setFormatter(logging.Formatter("[graphex] %(message)s"))
        logger.addHandler(_handler)
        logger.propagate = False


def info(msg: str, *args: object) -> None:
    if verbosity() >= 1:
        _ensure_handler()
        logger.setLevel(logging.DEBUG)
        logger.info(msg, *args)


def detail(msg: str, *args: object) -> None:
    if verbosity() >= 2:
        _ensure_handler()
        logger.setLevel(logging.DEBUG)
        logger.debug(msg, *args)


def detail_enabled() -> bool:
    return verbosity() >= 2
