"""The exceptions graphex raises. One base class, one subclass per subsystem.

Note [Our errors pass through Dynamo unwrapped]
Dynamo wraps any exception a backend raises in BackendCompilerFailed, except
the ShortenTraceback family, which it re-raises as is. GraphexError derives from
ShortenTraceback (with no frame to cut), so a user sees our message and our
class, not a wrapper around it; `except graphex.GraphexError` works.

Note [Errors are data, rendered at the edge]
An error that explains a problem carries it as fields (`error.finding`: what went
wrong, where in the user's code, why it matters, the fix, and the op and node
concerned). The message is rendered from those fields once; tools (`graphex
triage`, `graphex check`) read the fields, never the text.
"""

from __future__ import annotations

import dataclasses

from torch._dynamo.exc import ShortenTraceback


@dataclasses.dataclass
class Finding:
    """One explained problem. `what` is a sentence without the trailing period."""

    what: str
    where: str = ""  # the user's source line: 'model.py:42 in forward: y = f(x)'
    why: str = ""
    fix: str = ""  # may span lines (code to paste)
    op: str = ""  # 'ns::name.overload' or ''
    node: str = ""  # the FX node's name or ''
    detail: str = ""  # extra context lines (e.g. how a custom op was registered)

    def render(self, prefix: str = "graphex: ") -> str:
        text = f"{prefix}{self.what}."
        for line in self.detail.splitlines():
            text += f"\n  {line}"
        if self.where:
            text += f"\n  used at: {self.where}"
        if self.why:
            text += f"\n  why: {self.why.rstrip('.')}."
        if self.fix:
            if "\n" in self.fix:
                text += "\n  fix:\n" + "\n".join("    " + line for line in self.fix.splitlines())
            else:
                text += f"\n  fix: {self.fix}"
        return text


class GraphexError(ShortenTraceback):
    """Base class of every error graphex raises on purpose.

    Built from a message, or from a Finding's fields (Note [Errors are data, rendered at the edge]).
    """

    def __init__(self, message: str | None = None, *, finding: Finding | None = None) -> None:
        if message is None:
            message = finding.render() if finding is not None else ""
        super().__init__(message, first_useful_frame=None)
        self.finding = finding


class OptionsError(GraphexError, ValueError):
    """An unknown option or an option with a bad value."""


class CaptureError(GraphexError):
    """A graph that graphex cannot capture: the message names the op, its source line and the fix."""


class ProgramError(GraphexError):
    """A program spec the C++ core cannot build (raised by graphex._C)."""


class SignatureError(GraphexError):
    """A call whose inputs do not match the signature its graph was captured for."""


class ReplayError(GraphexError):
    """An operator failed while a captured graph ran: names the node and the user's source line."""


class CustomOpError(GraphexError):
    """A custom operator whose registration cannot work in a graph (missing or wrong fake, bad schema)."""


class FakeMismatch(GraphexError):
    """Internal: raised by the C++ engine on a validating run; turned into a CustomOpError with the fix."""

    def __init__(self, message: str, node_index: int = -1, output: int = -1, expected: str = "",
                 actual: str = "") -> None:
        super().__init__(message)
        self.node_index, self.output, self.expected, self.actual = node_index, output, expected, actual


class CacheError(GraphexError):
    """A compile-cache problem that cannot be handled by recompiling."""
