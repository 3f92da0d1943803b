"""Watch the script's torch.compile calls, and the calls of what they return, without replacing anything.

Note [Triage observes torch.compile through Python's profiling hook]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
While the script runs, `sys.setprofile` installs `CompileObserver._event`. Nothing of torch or
graphex is replaced: the hook only reads frames, with Python's public introspection.
- **A compile.** A frame of `torch.compile`'s own code starts: its parameters (`model`, `backend`,
  `options`, `fullgraph`, `dynamic`, `mode`: torch.compile's public signature) are read from
  the frame; when that frame returns, what it returned is the compiled object. The decorator
  form (`model=None`) is skipped: its function calls `torch.compile` again with the model.
  `Module.compile()` calls `torch.compile(self._call_impl)` and is seen the same way.
- **A call of a compiled object.** An object whose type defines `__call__` in Python (the
  OptimizedModule `torch.compile(module)` returns) is called when a frame of that `__call__`
  starts with the object as its first argument. A function (what `torch.compile(fn)` and
  `Module.compile()` return) is called when a frame of its code starts holding, in its free
  variables, the very objects of the function's closure (all such functions share one code
  object; the closure tells them apart). Its arguments are read with `inspect.getargvalues`.
  The first call's inputs and state are saved there, before the call's body runs.
- **An error.** A profiled frame that ends by an exception returns `None` to the hook, as one
  that returns `None` does. The call that last returned `None` is kept (its frame object), and
  the script's error is laid to it when that frame is in the error's traceback.

Cost: profiling slows the Python the script runs while it is observed (Dynamo's tracing is
Python), by about half on a small model's first compile (1.96 s -> 3.3 s on this machine).
Only the script's own run is observed; the analyses after it are not. The hook sees the
thread that runs the script (where triage runs it); a script that compiles in another thread
is not observed there. A profile function the script or a tool had set is called as well.
"""

from __future__ import annotations

import dataclasses
import inspect
import sys
import traceback
import types
from typing import Any, Callable

import torch

_COMPILE_CODE = inspect.unwrap(torch.compile).__code__


@dataclasses.dataclass(frozen=True)
class CompileCall:
    """What one torch.compile(...) was given (its public parameters), and where in the script."""

    target: Any
    backend: Any
    options: dict[str, Any] | None
    fullgraph: bool
    dynamic: bool | None
    site: str


@dataclasses.dataclass
class _Callee:
    """How the calls of one compiled object are recognised (Note [Triage observes ...])."""

    key: Any                                 # what CompileObserver's callbacks are given back
    code: types.CodeType
    self_name: str | None = None             # a Python __call__: its first parameter holds the object
    obj: Any = None
    closure: tuple[tuple[str, Any], ...] = ()  # a function: its free variables' names and objects

    def called_by(self, frame: types.FrameType) -> bool:
        local = frame.f_locals
        if self.self_name is not None:
            return local.get(self.self_name) is self.obj
        return all(local.get(name, _MISSING) is value for name, value in self.closure)


_MISSING = object()


def _contents(cell: Any) -> Any:
    try:
        return cell.cell_contents
    except ValueError:  # an empty cell
        return _MISSING


@dataclasses.dataclass
class _OpenCall:
    key: Any
    number: int
    site: str
    frame: types.FrameType


def default_backend() -> Any:
    """The backend torch.compile uses when given none."""
    get = getattr(torch.compiler, "get_default_backend", None)  # torch >= 2.13
    return get() if get is not None else "inductor"


def call_arguments(frame: types.FrameType, skip_self: bool) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The positional and keyword arguments a frame was called with, as it starts."""
    info = inspect.getargvalues(frame)
    names = info.args[1:] if skip_self else info.args
    args = tuple(info.locals[n] for n in names)
    if info.varargs:
        args += tuple(info.locals[info.varargs])
    kwargs = dict(info.locals[info.keywords]) if info.keywords else {}
    return args, kwargs


class CompileObserver:
    """Calls `on_compile(CompileCall, compiled) -> key` for each torch.compile the script makes,
    `on_call(key, number, args, kwargs, frame)` as each call of a compiled object starts (`call_site(frame,
    with_code=True)` names the script's line), and keeps
    the calls in progress (`current()`) and the last call of each that ended by an exception or None."""

    def __init__(self, on_compile: Callable[[CompileCall, Any], Any],
                 on_call: Callable[[Any, int, tuple[Any, ...], dict[str, Any], types.FrameType], None],
                 call_site: Callable[..., str]) -> None:
        self._on_compile, self._on_call, self._call_site = on_compile, on_call, call_site
        self._compiling: dict[int, CompileCall] = {}      # id(torch.compile frame) -> what it was given
        self._callees: dict[types.CodeType, list[_Callee]] = {}
        self._calls: dict[int, int] = {}                  # id(key) -> calls so far
        self._open: dict[int, _OpenCall] = {}             # id(frame) -> a call in progress
        self.stack: list[tuple[Any, str]] = []            # (key, call site) of the calls in progress, innermost last
        self.last_none: dict[int, _OpenCall] = {}         # id(key) -> its last call that returned None or raised
        self.hook_errors: list[str] = []                  # the hook's own failures (it must never raise into the script)
        self._previous: Any = None

    def __enter__(self) -> CompileObserver:
        self._previous = sys.getprofile()
        sys.setprofile(self._event)
        return self

    def __exit__(self, *exc: Any) -> None:
        sys.setprofile(self._previous)
        self.stack.clear()
        self._open.clear()

    def current(self) -> tuple[Any, str] | None:
        return self.stack[-1] if self.stack else None

    def raised_by(self, error: BaseException) -> tuple[Any, int, str] | None:
        """(key, call number, call site) of the compiled call `error` (or an exception it chains) came out of."""
        frames = {id(c.frame): c for c in self.last_none.values()}
        seen: list[BaseException] = []
        e: BaseException | None = error
        while e is not None and not any(e is s for s in seen):
            seen.append(e)
            for frame, _ in traceback.walk_tb(e.__traceback__):
                hit = frames.get(id(frame))
                if hit is not None and hit.frame is frame:
                    return hit.key, hit.number, hit.site
            e = e.__cause__ or e.__context__
        return None

    # The profile function: called for every Python and C call and return of this thread.
    def _event(self, frame: types.FrameType, event: str, arg: Any) -> None:
        if self._previous is not None:
            self._previous(frame, event, arg)
        if event == "call":
            code = frame.f_code
            if code is _COMPILE_CODE or code in self._callees:
                self._guarded(self._started, frame, code)
        elif event == "return" and (self._open or self._compiling) and (id(frame) in self._open
                                                                       or id(frame) in self._compiling):
            self._guarded(self._returned, frame, arg)

    def _guarded(self, fn: Callable[..., None], *args: Any) -> None:
        # An exception out of a profile function would unset it and surface in the script's code.
        try:
            fn(*args)
        except Exception as e:  # noqa: BLE001
            self.hook_errors.append("".join(traceback.format_exception_only(type(e), e)).strip())

    def _started(self, frame: types.FrameType, code: types.CodeType) -> None:
        if code is _COMPILE_CODE:
            given = inspect.getargvalues(frame).locals
            if given.get("model") is None:  # @torch.compile(...): its decorator calls torch.compile again
                return
            backend = given.get("backend")
            self._compiling[id(frame)] = CompileCall(
                target=given["model"], backend=default_backend() if backend is None else backend,
                options=given.get("options"), fullgraph=bool(given.get("fullgraph", False)),
                dynamic=given.get("dynamic"), site=self._call_site(frame.f_back, with_code=False))
            return
        for callee in self._callees[code]:
            if callee.called_by(frame):
                number = self._calls[id(callee.key)] = self._calls.get(id(callee.key), 0) + 1
                args, kwargs = call_arguments(frame, skip_self=callee.self_name is not None)
                site = self._call_site(frame.f_back)
                self._on_call(callee.key, number, args, kwargs, frame)
                self._open[id(frame)] = _OpenCall(callee.key, number, site, frame)
                self.stack.append((callee.key, site))
                return

    def _returned(self, frame: types.FrameType, value: Any) -> None:
        given = self._compiling.pop(id(frame), None)
        if given is not None:
            if value is not None:  # None: torch.compile raised
                self._watch(self._on_compile(given, value), value)
            return
        call = self._open.pop(id(frame))
        if self.stack and self.stack[-1][0] is call.key:
            self.stack.pop()
        if value is None:
            self.last_none[id(call.key)] = call

    def _watch(self, key: Any, compiled: Any) -> None:
        if isinstance(compiled, types.FunctionType):
            closure = tuple((name, _contents(cell)) for name, cell in
                            zip(compiled.__code__.co_freevars, compiled.__closure__ or ()))
            callee = _Callee(key, compiled.__code__, closure=closure)
        else:
            call = getattr(type(compiled), "__call__", None)
            if not isinstance(call, types.FunctionType):
                self.hook_errors.append(f"cannot watch the calls of a {type(compiled).__name__} torch.compile returned")
                return
            callee = _Callee(key, call.__code__, self_name=call.__code__.co_varnames[0], obj=compiled)
        self._callees.setdefault(callee.code, []).append(callee)
