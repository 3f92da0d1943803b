"""Run the user's script and see what it compiles, without replacing anything.

Note [How triage sees the script's model]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
The script runs in this process (runpy), as `__main__` or, with --entry, imported and its
function called. While it runs, a CompileObserver (Note [Triage observes torch.compile through
Python's profiling hook], observe.py) records each torch.compile the script makes: what was
compiled, with which backend and options. At the first call of each compiled object, before the
call runs, it saves clones of the inputs, and of every other tensor the call can change
(Note [Triage restores all state a step can mutate], state.py). Every later analysis
(re-tracing for all graph breaks, the accuracy bisection) replays that first call on fresh
clones with that state put back. The script's error is laid to the compiled call it came out
of, and each call in progress is "the current call" that Dynamo's log records are tagged with.

The copies the user's own Dynamo graph makes are counted through graphex's on-capture registry
(Note [Tools see captures through one registry]). Nothing of torch or graphex is replaced.

A script that fails outside any compiled call is run once more in a fresh interpreter with
every torch.compile run eagerly (torch.compiler.set_stance("force_eager"); a second run here
would register its custom ops twice): if it fails there too, the script itself is broken
(exit code 2).
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import os
import runpy
import subprocess
import sys
import traceback
import types
from typing import Any

import torch
import torch.utils._pytree as pytree

from .dynamo_logs import DynamoLogs, LogEvent
from .findings import is_internal, location, short_path
from .observe import CompileCall, CompileObserver
from .state import Snapshot, snapshot

_GRAPHEX_BACKENDS = ("graphex", "npugraph_ex", "graphex_backend", "npugraph_ex_backend")


@dataclasses.dataclass
class Compiled:
    """One torch.compile(...) the script made, and what happened when it was called."""

    index: int
    target: Any                 # the model or function given to torch.compile
    name: str
    compiled_at: str            # the script's torch.compile line
    backend: Any
    options: dict[str, Any] | None
    fullgraph: bool
    dynamic: bool | None
    calls: int = 0
    first_args: tuple[Any, ...] | None = None
    first_kwargs: dict[str, Any] | None = None
    first_state: Snapshot | None = None
    first_call_at: str = ""
    first_needs_grad: bool = False  # grad mode on and an input or parameter requires grad at the first call
    error: BaseException | None = None
    error_call: int = 0         # which call raised (1 = the first)
    error_call_at: str = ""

    @property
    def is_graphex(self) -> bool:
        name = self.backend if isinstance(self.backend, str) else getattr(self.backend, "__name__", "")
        return name in _GRAPHEX_BACKENDS

    def graphex_options(self) -> dict[str, Any]:
        return dict(self.options or {}) if self.is_graphex else {}

    def module(self) -> torch.nn.Module | None:
        target = self.target
        if isinstance(target, torch.nn.Module):
            return target
        owner = getattr(target, "__self__", None)  # Module.compile() compiles the bound _call_impl
        return owner if isinstance(owner, torch.nn.Module) else None

    def state_after(self) -> dict[str, torch.Tensor]:
        """The state the first call can change, as it is now (after a rerun): name -> clone."""
        return self.first_state.current() if self.first_state is not None else {}

    def fresh_inputs(self) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """Clones of the first call's inputs, with every other tensor it can change put back as it was then."""
        if self.first_state is not None:
            self.first_state.restore()
        return clone_tree(self.first_args or ()), clone_tree(self.first_kwargs or {})


@dataclasses.dataclass
class ScriptRun:
    script: str
    argv: list[str]
    entry: str | None
    compiled: list[Compiled] = dataclasses.field(default_factory=list)
    events: list[LogEvent] = dataclasses.field(default_factory=list)
    error: BaseException | None = None  # what the script raised (SystemExit with a non-zero code included)
    failed_in: Compiled | None = None  # the compiled function the script's error came out of
    observer_errors: list[str] = dataclasses.field(default_factory=list)  # the observer's own failures
    # graph name -> the user's own copies in its Dynamo graph (Note [A copy the user wrote is not a problem])
    user_copies: dict[str, tuple[int, str]] = dataclasses.field(default_factory=dict)


class EntryError(Exception):
    """--entry names no function of the script."""


def clone_tree(tree: Any) -> Any:
    def clone(t: Any) -> Any:
        return t.detach().clone() if isinstance(t, torch.Tensor) else t

    return pytree.tree_map(clone, tree)


def user_call_site(frame: types.FrameType | None, with_code: bool = True) -> str:
    """The innermost frame from `frame` outwards outside torch and graphex: the script's line that made this call."""
    while frame is not None and is_internal(frame.f_code.co_filename):
        frame = frame.f_back
    if frame is None:
        return ""
    return location(frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name, None if with_code else "")


_observer: CompileObserver | None = None  # while a script runs


def current_call() -> tuple[Compiled, str] | None:
    """The compiled call in progress (innermost) and its call site, while the script runs."""
    return _observer.current() if _observer is not None else None


def _first_call(entry: Compiled, number: int, args: tuple[Any, ...], kwargs: dict[str, Any],
                frame: types.FrameType) -> None:
    entry.calls = number
    if number == 1:
        entry.first_args, entry.first_kwargs = clone_tree(args), clone_tree(kwargs)
        entry.first_state = snapshot(entry.target, entry.module(), args, kwargs)
        entry.first_call_at = user_call_site(frame.f_back)
        entry.first_needs_grad = torch.is_grad_enabled() and _requires_grad(entry.module(), args, kwargs)


def _requires_grad(module: torch.nn.Module | None, args: Any, kwargs: Any) -> bool:
    tensors = [t for t in pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
    if module is not None:
        tensors += list(module.parameters())
    return any(t.requires_grad for t in tensors)


def _recording(run: ScriptRun) -> CompileObserver:
    def compiled(given: CompileCall, result: Any) -> Compiled:
        model = given.target
        owner = model if isinstance(model, torch.nn.Module) else getattr(model, "__self__", None)
        entry = Compiled(
            index=len(run.compiled), target=model, compiled_at=given.site,
            name=type(owner).__name__ if isinstance(owner, torch.nn.Module) else getattr(model, "__qualname__", "fn"),
            backend=given.backend, options=given.options, fullgraph=given.fullgraph, dynamic=given.dynamic)
        run.compiled.append(entry)
        return entry

    return CompileObserver(compiled, _first_call, user_call_site)


def _counting_user_copies(run: ScriptRun) -> contextlib.AbstractContextManager[None]:
    """While the script runs, record per graph graphex captures the copies the user's Dynamo graph makes
    (Note [Tools see captures through one registry])."""
    from ...compile import on_capture
    from .capture import user_copies

    def note(dynamo_graph: torch.fx.GraphModule, compiled: Any) -> None:
        run.user_copies[compiled.name] = user_copies(dynamo_graph)

    return on_capture(note)


def _execute(script: str, argv: list[str], entry: str | None) -> Any:
    """Run `script` as __main__, or import it and call `entry()`; returns what the entry returned."""
    saved_argv, saved_path = sys.argv[:], sys.path[:]
    sys.argv = [script, *argv]
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    try:
        if entry is None:
            runpy.run_path(script, run_name="__main__")
            return None
        namespace = runpy.run_path(script, run_name="__graphex_triage__")
        fn = namespace.get(entry)
        if not callable(fn):
            raise EntryError(f"{script} defines no function {entry!r} (--entry)")
        return fn()
    finally:
        sys.argv, sys.path[:] = saved_argv, saved_path


def _compile_returned(run: ScriptRun, returned: Any) -> None:
    """--entry returned (model_or_fn, args) and compiled nothing itself: compile it the MRE way and call it."""
    if run.compiled or not (isinstance(returned, tuple) and len(returned) in (2, 3) and callable(returned[0])):
        return
    target, args = returned[0], returned[1]
    kwargs = returned[2] if len(returned) == 3 else {}
    compiled = torch.compile(target, backend="graphex", fullgraph=True, dynamic=False)
    run.compiled[-1].compiled_at = f"{short_path(run.script)}, returned by {run.entry}()"
    with torch.no_grad():
        compiled(*(args if isinstance(args, (tuple, list)) else (args,)), **kwargs)


def run_script(script: str, argv: list[str], entry: str | None = None) -> ScriptRun:
    """Run the script under graphex, observed as Note [How triage sees the script's model] says."""
    global _observer
    run = ScriptRun(script, list(argv), entry)
    output = io.StringIO()  # the script's own printing stays out of the report
    _observer = observer = _recording(run)
    try:
        with contextlib.redirect_stdout(output), contextlib.redirect_stderr(output), \
                DynamoLogs(tag=current_call) as logs, _counting_user_copies(run):
            try:
                with observer:
                    returned = _execute(script, argv, entry)
                    _compile_returned(run, returned)
            except SystemExit as e:
                if e.code not in (None, 0):
                    run.error = e
            except EntryError:
                raise
            except Exception as e:  # the script's own failure is what we report on
                run.error = e
    finally:
        _observer = None
    run.events = logs.events
    run.observer_errors = list(observer.hook_errors)
    if run.error is not None:
        raised = observer.raised_by(run.error)
        if raised is not None:
            run.failed_in, number, site = raised
            run.failed_in.error, run.failed_in.error_call, run.failed_in.error_call_at = run.error, number, site
    return run


def eager_failure(run: ScriptRun) -> str | None:
    """Does the script fail without graphex? The error text if it does, else None.

    An error out of a compiled call is checked by calling the model eagerly on that call's
    inputs; anything else by re-running the whole script with torch.compile a no-op.
    """
    entry = run.failed_in
    if entry is not None and entry.error_call == 1 and entry.first_args is not None:
        args, kwargs = entry.fresh_inputs()
        try:
            with torch.no_grad(), contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
                entry.target(*args, **kwargs)
        except Exception as e:
            return "".join(traceback.format_exception_only(type(e), e)).strip()
        return None
    code = "import sys; from graphex.tools.triaging.runner import eager_main; sys.exit(eager_main())"
    proc = subprocess.run([sys.executable, "-c", code, run.script, run.entry or "", *run.argv],
                          capture_output=True, text=True, timeout=1800)
    if proc.returncode == 0:
        return None
    return (proc.stderr.strip() or proc.stdout.strip() or f"exit code {proc.returncode}")[-3000:]


def eager_main() -> int:
    """`python -c ...eager_main()` SCRIPT ENTRY ARGS...: the script with every torch.compile run eagerly (torch's
    public stance "force_eager": nothing of torch is replaced)."""
    script, entry, argv = sys.argv[1], sys.argv[2] or None, sys.argv[3:]
    try:
        with torch.compiler.set_stance("force_eager"):
            _execute(script, argv, entry)
    except SystemExit as e:
        if e.code not in (None, 0):
            raise
    except Exception as e:
        frames = [f for f in traceback.extract_tb(e.__traceback__) if not is_internal(f.filename)]
        print("Traceback (most recent call last):\n" + "".join(traceback.format_list(frames))
              + "".join(traceback.format_exception_only(type(e), e)), end="", file=sys.stderr)
        return 1
    return 0
