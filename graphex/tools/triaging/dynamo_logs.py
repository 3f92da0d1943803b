"""Dynamo's graph-break and recompile logs, collected while user code runs.

These are the `TORCH_LOGS=graph_breaks,recompiles` messages (torch._logging.set_logs). Each
record is kept with a tag the caller supplies (the compiled function being called and the
user's call site), so a recompile can be tied to the line that passed the new value.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import sys
from typing import Any, Callable

import torch

# (module whose artifact logger it is, artifact) -> kind of event
_ARTIFACTS = {
    ("torch._dynamo.symbolic_convert", "graph_breaks"): "graph-break",
    ("torch._dynamo.guards", "recompiles"): "recompile",
}
_LIMIT_LOGGER = "torch._dynamo.convert_frame"  # warns "torch._dynamo hit config.recompile_limit"


@dataclasses.dataclass
class LogEvent:
    kind: str      # "graph-break" | "recompile" | "limit"
    message: str
    tag: Any       # what the tag function returned when it was logged
    exc: BaseException | None = None  # the exception being handled when it was logged (a break's own error)


class _Collector(logging.Handler):
    def __init__(self, kind: str, events: list[LogEvent], tag: Callable[[], Any], only: str = "") -> None:
        super().__init__(logging.DEBUG)
        self.kind, self.events, self.tag, self.only = kind, events, tag, only

    def emit(self, record: logging.LogRecord) -> None:
        try:
            message = record.getMessage()
        except Exception:  # a record we cannot format is not one of ours
            return
        if self.only in message:
            # Dynamo logs a graph break while handling its exception: the error object itself,
            # with graphex's fields (error.finding) when it is ours, is read from there.
            self.events.append(LogEvent(self.kind, message, self.tag(), sys.exc_info()[1]))


class DynamoLogs:
    """`with DynamoLogs(tag) as logs:` ... `logs.events`. Dynamo's own printing of them is off meanwhile.

    torch's log handlers write to the sys.stderr of the moment set_logs() runs: entered inside a
    redirect, torch's other messages go there too; on exit they are pointed back at the real stderr.
    """

    def __init__(self, tag: Callable[[], Any] = lambda: None) -> None:
        self.tag = tag
        self.events: list[LogEvent] = []
        self._undo: list[Callable[[], None]] = []

    def __enter__(self) -> "DynamoLogs":
        torch._logging.set_logs(graph_breaks=True, recompiles=True)
        for (module, artifact), kind in _ARTIFACTS.items():
            self._attach(torch._logging.getArtifactLogger(module, artifact), _Collector(kind, self.events, self.tag),
                         silence=True)
        self._attach(logging.getLogger(_LIMIT_LOGGER),
                     _Collector("limit", self.events, self.tag, only="hit config."), silence=False)
        return self

    def _attach(self, logger: logging.Logger, handler: logging.Handler, *, silence: bool) -> None:
        propagate = logger.propagate
        logger.addHandler(handler)
        if silence:
            logger.propagate = False

        def undo() -> None:
            logger.removeHandler(handler)
            logger.propagate = propagate

        self._undo.append(undo)

    def __exit__(self, *exc: object) -> None:
        for undo in reversed(self._undo):
            undo()
        self._undo.clear()
        with contextlib.redirect_stderr(sys.__stderr__):
            torch._logging.set_logs()
