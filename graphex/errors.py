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
    """A program the C++ core cannot build (raised by graphex._C)."""


class SignatureError(GraphexError):
    """A call whose inputs do not match the signature its graph was captured for."""


class FrozenInputReplaced(SignatureError):
    """A frozen parameter (frozen_parameter=True) was replaced by another tensor after compiling.

    Raised by the engine (Note [A frozen parameter is checked by identity]); a compiled graph
    catches it and re-lowers with the new tensor, so users see it only from a bare executor.
    """

    def __init__(self, message: str, input: int) -> None:
        super().__init__(message)
        self.input = input


class ReplayError(GraphexError):
    """An operator failed while a captured graph ran: names the node and the user's source line.

    Raised as a class that is also what eager raises (Note [A replay error keeps its cause]):
    `except IndexError` and `except graphex.ReplayError` both catch an out-of-range index.
    """

    def __str__(self) -> str:  # not KeyError's repr() when mixed with KeyError
        return str(self.args[0]) if self.args else ""


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


# Note [A replay error keeps its cause]
# An operator that fails in a captured graph fails as it would in eager, plus graphex's part:
# the error is a ReplayError *and* the class eager raises (ReplayIndexError is a ReplayError
# and an IndexError), created once per class. Its finding carries the kernel's own message
# (what), the user's source line (where), the op and the node; a Python kernel's exception is
# kept as __cause__ and its class is the one mixed in. The C++ executor reports the kind of a
# c10 error (csrc/runtime/executor.h, KernelErrorKind); graphex._C calls graphex.runtime.make_replay_error.

_replay_classes: dict[type, type[ReplayError]] = {}


def replay_error_class(base: type[BaseException]) -> type[ReplayError]:
    """The ReplayError that is also a `base` (IndexError -> ReplayIndexError), made once per class."""
    if issubclass(ReplayError, base):  # RuntimeError, Exception: ReplayError already is one
        return ReplayError
    if issubclass(base, ReplayError):
        return base
    cls = _replay_classes.get(base)
    if cls is None:
        try:
            cls = type(f"Replay{base.__name__}", (ReplayError, base),
                       {"__module__": __name__, "__doc__": f"A ReplayError that is also a {base.__qualname__}."})
        except TypeError:  # a class that cannot be mixed (instance layout, metaclass, final)
            cls = ReplayError
        _replay_classes[base] = cls
    return cls


ReplayIndexError = replay_error_class(IndexError)
ReplayValueError = replay_error_class(ValueError)
ReplayTypeError = replay_error_class(TypeError)
ReplayNotImplementedError = replay_error_class(NotImplementedError)


def _c10_error_class(kind: str) -> type[BaseException]:
    """The Python class torch raises for a c10 error class (torch/csrc/Exceptions.h)."""
    import builtins

    import torch

    where = {"LinAlgError": torch.linalg, "OutOfMemoryError": torch, "AcceleratorError": torch}
    if kind.startswith("Dist") or kind == "QueueEmptyError":
        import torch.distributed
        where[kind] = torch.distributed
    found = getattr(where.get(kind, builtins), kind, RuntimeError)
    return found if isinstance(found, type) and issubclass(found, BaseException) else RuntimeError


def make_replay_error(kind: str, message: str, graph: str, node: str, op: str, source: str,
                      cause: BaseException | None = None, *, why: str = "", fix: str = "") -> ReplayError:
    """The error for an operator that failed at replay (graphex._C calls it through graphex.runtime, which adds
    `why` and `fix` where it knows more: Note [A collective that fails names its peers]).

    `kind` names the c10 error class (IndexError, LinAlgError, ...; RuntimeError for a plain
    c10::Error); `cause` is a Python kernel's exception, whose class wins and which becomes __cause__.
    """
    if cause is not None:
        message = str(cause) or type(cause).__name__
        base: type[BaseException] = type(cause)
    else:
        base = _c10_error_class(kind)
    what = message.strip().rstrip(".") or f"{base.__name__} without a message"
    raised_at = _kernel_line(cause)
    finding = Finding(what=what, where=source, op=op, node=node, why=why, fix=fix,
                      detail=f"raised in the kernel at {raised_at}" if raised_at else "")
    text = finding.render(prefix=f"graphex: {graph}: node '{node}' ({op}) failed: ")
    try:
        error = replay_error_class(base)(text, finding=finding)
    except Exception:  # a class whose construction we cannot drive: the plain ReplayError
        error = ReplayError(text, finding=finding)
    # torch.compile's frame re-raises errors `from None` (Dynamo's ShortenTraceback handling), which
    # drops __cause__ on that path; kernel_error keeps the kernel's exception either way.
    error.__cause__ = cause
    error.kernel_error = cause  # type: ignore[attr-defined]
    return error


def _kernel_line(cause: BaseException | None) -> str:
    """'my_ops.py:12 in kernel: raise ValueError(...)': the innermost frame of a Python kernel's
    error outside torch itself, or '' (one line instead of the Python stack)."""
    import linecache
    import os
    import traceback

    import torch

    if cause is None or cause.__traceback__ is None:
        return ""
    torch_dir = os.path.dirname(torch.__file__) + os.sep
    for frame in reversed(traceback.extract_tb(cause.__traceback__)):
        if frame.filename.startswith(torch_dir) or frame.filename.startswith("<"):
            continue
        code = (frame.line or linecache.getline(frame.filename, frame.lineno or 0)).strip()
        return f"{os.path.basename(frame.filename)}:{frame.lineno} in {frame.name}" + (f": {code}" if code else "")
    return ""
