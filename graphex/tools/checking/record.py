"""Run the user's script in eager and record its custom-op calls with their real arguments.

Note [How calls are recorded]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
A TorchDispatchMode sees every operator call as an OpOverload with real tensors,
below autograd. For a custom op (registration.is_custom) it clones the inputs,
runs the kernel, and keeps the outputs and which inputs the kernel wrote. A
write is seen two ways: the values changed, or an op with a `(a!)` argument
touched an input's storage while the kernel ran. The second needs a mode that
sees the kernel's own ops: a mode runs its handler with itself popped, so the
recorder pushes a _WriteWatcher and redispatches the op below the Python key.
That catches writes of unchanged values, from Python kernels and from C++
kernels that call ATen through the dispatcher (not raw pointer writes). Calls
are deduplicated by input signature and capped per op.

Every torch.compile'd call runs eagerly while the script runs (torch's public
stance, torch.compiler.set_stance("force_eager"): nothing of torch is replaced),
so a script that compiles its model still runs, and is recorded, in eager.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import runpy
import sys
import traceback
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from graphex.custom_ops.registration import is_custom

from . import values


@dataclasses.dataclass
class Call:
    """One recorded call: inputs as they were before it ran, and what it did."""

    op: torch._ops.OpOverload
    index: int                    # 1-based among the recorded calls of this op
    args: tuple                   # clones, before the call
    kwargs: dict
    outputs: Any                  # clones of what the kernel returned
    after: dict[str, Any]         # input name -> clone after the call (written inputs only)
    written: dict[str, str]       # input name -> how we know it was written
    aliases: list[tuple[int, str, bool]]  # (output index, input name, the output *is* that input)
    rng_state: torch.Tensor | None = None  # the CPU generator before the call (a kernel may draw from it)

    @property
    def case_id(self) -> str:
        return f"{self.op.name()}#{self.index}"

    def bound(self) -> dict[str, Any]:
        return values.bind(self.op._schema, self.args, self.kwargs)

    def inputs_text(self) -> str:
        return ", ".join(f"{k}={values.short(v)}" for k, v in self.bound().items())


@dataclasses.dataclass
class Recording:
    calls: dict[str, list[Call]]  # op name -> recorded calls, in call order
    total: dict[str, int]         # op name -> calls seen (recorded or not)


class ScriptFailed(Exception):
    """The user's script raised (or exited non-zero); the message is its traceback. `failed_in`: the
    custom op whose kernel raised, and its inputs, when the failure happened inside one. `recording`:
    the calls that completed before the failure (still checked and reported)."""

    def __init__(self, message: str, failed_in: tuple[torch._ops.OpOverload, str] | None = None,
                 recording: Recording | None = None) -> None:
        super().__init__(message)
        self.failed_in = failed_in
        self.recording = recording


class _WriteWatcher(TorchDispatchMode):
    """Notes every `(a!)` argument of an inner op that shares storage with a watched input."""

    def __init__(self, storages: dict[int, str]) -> None:
        super().__init__()
        self.storages = storages
        self.writes: dict[str, str] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        for i, a in enumerate(func._schema.arguments):
            if a.alias_info is None or not a.alias_info.is_write:
                continue
            value = args[i] if i < len(args) else kwargs.get(a.name)
            for t in values.tensors(value):
                name = self.storages.get(values.storage_key(t))
                if name is not None:
                    self.writes.setdefault(name, f"{func.name()} wrote it")
        return func(*args, **kwargs)


class Recorder(TorchDispatchMode):
    def __init__(self, max_per_op: int = 3) -> None:
        super().__init__()
        self.max_per_op = max_per_op
        self.calls: dict[str, list[Call]] = {}
        self.total: dict[str, int] = {}
        self._seen: set[tuple] = set()
        self.failed_in: tuple[torch._ops.OpOverload, str] | None = None

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if not is_custom(func):
            return func(*args, **kwargs)
        try:
            return self._record(func, args, kwargs)
        except Exception:
            if self.failed_in is None:
                bound = values.bind(func._schema, args, kwargs)
                self.failed_in = (func, ", ".join(f"{k}={values.short(v)}" for k, v in bound.items()))
            raise

    def _record(self, func: torch._ops.OpOverload, args: tuple, kwargs: dict) -> Any:
        name = func.name()
        self.total[name] = self.total.get(name, 0) + 1
        key = (name, values.signature(args), values.signature(kwargs))
        recorded = self.calls.setdefault(name, [])
        if key in self._seen or len(recorded) >= self.max_per_op:
            return func(*args, **kwargs)
        self._seen.add(key)
        try:
            before_args, before_kwargs = values.clone(args), values.clone(kwargs)
            live = values.bind(func._schema, args, kwargs)
            storages = {values.storage_key(t): n.split("[")[0] for n, t in values.named_tensors(live)}
            storages.pop(None, None)
        except Exception as e:  # noqa: BLE001  (never break the user's script: run the call unrecorded)
            print(f"graphex check: cannot record a call of {name}: {e}", file=sys.stderr)
            return func(*args, **kwargs)
        watcher = _WriteWatcher(storages)
        rng_state = torch.random.get_rng_state()
        with watcher:
            out = _below_python(func, args, kwargs)
        try:
            recorded.append(_call(func, len(recorded) + 1, before_args, before_kwargs, live, out, watcher.writes))
            recorded[-1].rng_state = rng_state
        except Exception as e:  # noqa: BLE001
            print(f"graphex check: cannot record a call of {name}: {e}", file=sys.stderr)
        return out


def _below_python(func: torch._ops.OpOverload, args: tuple, kwargs: dict) -> Any:
    """Run the op's kernel with the watcher seeing its ops (see the Note)."""
    ts = values.tensors((args, kwargs))
    if not ts:
        return func(*args, **kwargs)
    keys = torch._C._dispatch_keys(ts[0])
    for t in ts[1:]:
        keys = keys | torch._C._dispatch_keys(t)
    return func.redispatch(keys & torch._C._dispatch_keyset_full_after(torch._C.DispatchKey.Python), *args, **kwargs)


def _call(op, index, args, kwargs, live: dict[str, Any], out: Any, writes: dict[str, str]) -> Call:
    before = values.bind(op._schema, args, kwargs)
    written, after = dict(writes), {}
    for name, value in live.items():
        if not values.tensors(value):
            continue
        if any(not values.same_values(a, b) for a, b in zip(values.tensors(before[name]), values.tensors(value))):
            written[name] = "its values changed"
        if name in written:
            after[name] = values.clone(value)
    aliases = []
    inputs = list(values.named_tensors(live))
    for i, o in enumerate(values.outputs_list(out)):
        for t in values.tensors(o):
            key = values.storage_key(t)
            for input_name, inp in inputs:
                if key is not None and key == values.storage_key(inp):
                    aliases.append((i, input_name, t is inp))
                    break
    return Call(op, index, args, kwargs, values.clone(out), after, written, aliases)


def run_script(path: str, argv: list[str], entry: str | None = None, max_per_op: int = 3) -> Recording:
    """Run SCRIPT as __main__ (or import it and call ENTRY()) in eager, recording custom-op calls."""
    path = os.path.abspath(path)
    if not os.path.isfile(path):
        raise ScriptFailed(f"no such script: {path}")
    recorder = Recorder(max_per_op)
    saved_argv, saved_path = sys.argv, list(sys.path)
    sys.argv = [path, *argv]
    sys.path.insert(0, os.path.dirname(path))
    try:
        # every torch.compile'd call runs eagerly (torch's public stance; nothing of torch is replaced)
        with recorder, torch.compiler.set_stance("force_eager"):
            if entry is None:
                runpy.run_path(path, run_name="__main__")
            else:
                _load_module(path)
                fn = getattr(sys.modules["__graphex_check__"], entry, None)
                if not callable(fn):
                    raise ScriptFailed(f"{path} defines no function {entry}() (from --entry)")
                fn()
    except SystemExit as e:
        if e.code not in (None, 0):
            raise ScriptFailed(f"the script exited with status {e.code}") from None
    except ScriptFailed:
        raise
    except Exception as e:  # noqa: BLE001  (anything the script raises is its failure, reported as is)
        raise ScriptFailed(_traceback_from(path, e), recorder.failed_in,
                           Recording(recorder.calls, recorder.total)) from None
    finally:
        sys.argv, sys.path[:] = saved_argv, saved_path
    return Recording(recorder.calls, recorder.total)


def _load_module(path: str) -> None:
    spec = importlib.util.spec_from_file_location("__graphex_check__", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["__graphex_check__"] = module
    spec.loader.exec_module(module)


# torch.compiler.disable wrappers around dispatch: present on every call while a mode is active
_WRAPPERS = (os.path.join("torch", "_compile.py"), os.path.join("torch", "_dynamo", "eval_frame.py"))


def _traceback_from(path: str, exc: BaseException) -> str:
    """The traceback from the script's first frame on, without our recorder's frames."""
    tb = exc.__traceback__
    while tb is not None and os.path.abspath(tb.tb_frame.f_code.co_filename) != path:
        tb = tb.tb_next
    ours = os.path.dirname(os.path.abspath(__file__))
    frames = [f for f in traceback.extract_tb(tb or exc.__traceback__)
              if os.path.dirname(os.path.abspath(f.filename)) != ours and not f.filename.endswith(_WRAPPERS)]
    return ("Traceback (most recent call last):\n" + "".join(traceback.format_list(frames))
            + "".join(traceback.format_exception_only(type(exc), exc)))
