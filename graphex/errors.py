"""The exceptions graphex raises. One base class, one subclass per subsystem.

Note [Our errors pass through Dynamo unwrapped]
Dynamo wraps any exception a backend raises in BackendCompilerFailed, except
the ShortenTraceback family, which it re-raises as is. GraphexError derives from
ShortenTraceback (with no frame to cut), so a user sees our message and our
class, not a wrapper around it; `except graphex.GraphexError` works.
"""

from __future__ import annotations

from torch._dynamo.exc import ShortenTraceback


class GraphexError(ShortenTraceback):
    """Base class of every error graphex raises on purpose."""

    def __init__(self, message: str) -> None:
        super().__init__(message, first_useful_frame=None)


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
