"""One fuzzed program under eager and graphex, compared bit for bit; shrinking; reproducers.

Note [What a fuzzed program must match]
Each program runs on fresh copies of the same inputs in eager, then compiled with graphex (fullgraph=True),
twice: the capture call and a replay. Both calls' outputs and the inputs afterwards (the program writes
inputs and views of inputs in place) must be eager's, byte for byte (Note [Bitwise means the bytes]).
Between the two calls every tensor the first returned is overwritten, as a caller may: a result that is
memory the program keeps across calls would show in the replay (found 2026-12-06: a folded constant).
On every third seed some inputs are frozen buffers of a module (Note [Some fuzzed inputs are frozen buffers]).
A mismatch is classified like an OpInfo case (Note [How a sweep failure is classified]): only a failure
that aot_eager does not share is graphex's; a program eager rejects is `invalid` and skipped.
"""

from __future__ import annotations

import linecache
import os
import signal
import types
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch

from . import fuzz_ops  # noqa: F401 - registers torch.ops.graphex_fuzz
from .compare import alias_difference, clone_tree, difference
from .fuzz_gen import Input, Program

FAILURES = ("graphex_diff", "graphex_error")
_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16, "int64": torch.int64}
_count = [0]


class _Timeout(Exception):
    pass


@dataclass
class Outcome:
    kind: str  # ok | ok_no_engine (Dynamo left the engine nothing to run) | invalid | as_aot_eager | not_graphex | graphex_diff | graphex_error | timeout
    detail: str = ""


def make_inputs(inputs: Sequence[Input], seed: int) -> list[torch.Tensor]:
    """The program's inputs, deterministic in `seed`, with the layouts asked for (strides, offsets, stride 0)."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for spec in inputs:
        if spec.layout.startswith("alias"):  # a view of input 0 (of input N for "alias_...@N"), sharing its memory
            kind, _, at = spec.layout.partition("@")
            of = out[int(at or 0)]
            out.append(of[1:] if kind == "alias_slice" else of.select(0, 0))
            continue
        shape, dtype = list(spec.shape), _DTYPES[spec.dtype]
        base_shape = list(shape)
        if spec.layout == "transposed" and len(shape) >= 2:
            base_shape[0], base_shape[1] = shape[1], shape[0]
        elif spec.layout == "sliced" and shape:
            base_shape[-1] = shape[-1] * 2
        elif spec.layout == "expanded" and shape:
            base_shape[0] = 1
        if dtype == torch.int64:
            base = torch.randint(-4, 5, base_shape, generator=g)
        else:
            base = (torch.randn(base_shape, generator=g) * 2).to(dtype)
        if spec.layout == "transposed" and len(shape) >= 2:
            t = base.transpose(0, 1)
        elif spec.layout == "sliced" and shape:
            t = base[..., ::2]
        elif spec.layout == "expanded" and shape:
            t = base.expand(shape)
        else:
            t = base
        out.append(t)
    return out


def load(source: str) -> Callable[..., Any]:
    """The program as a function with a code object of its own (so Dynamo compiles each load afresh)."""
    _count[0] += 1
    filename = f"<graphex fuzz program {_count[0]}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    namespace: dict[str, Any] = {"torch": torch}
    exec(compile(source, filename, "exec"), namespace)
    return namespace["program"]


def _call(fn: Callable[..., Any], inputs: list[torch.Tensor]) -> tuple[Any, list[torch.Tensor]]:
    args = clone_tree(inputs)
    out = fn(*args)
    return out, args


def _error(e: BaseException) -> str:
    """'Type: first line'; for Dynamo's BackendCompilerFailed, the backend's own exception (its first line is
    only "backend='graphex' raised:")."""
    inner = getattr(e, "inner_exception", None)
    if inner is not None:
        return f"{type(e).__name__}: " + _error(inner)
    lines = f"{type(e).__name__}: {e}".strip().splitlines()
    return lines[0][:300] if lines else type(e).__name__


def held_inputs(inputs: Sequence[Input], seed: int) -> list[int]:
    """Note [Some fuzzed inputs are frozen buffers]
    On every third seed the program's even-numbered plain inputs are buffers of a module compiled with
    frozen_parameter=True (graphex computes what reads only them once, graphex/lowering/fold.py), reset to the
    seed's values before each call: the values stay eager's, so every output, write and alias must too. Inputs that
    alias another, or that another aliases, or with overlapping memory, stay arguments."""
    if seed % 3:
        return []
    aliased = {int(s.layout.partition("@")[2] or 0) for s in inputs if s.layout.startswith("alias")}
    return [i for i, s in enumerate(inputs) if i % 2 == 0 and i not in aliased
            and not s.layout.startswith("alias") and s.layout != "expanded"]


class _Held(torch.nn.Module):
    """The program with inputs `held` as buffers (Note [Some fuzzed inputs are frozen buffers]). Its forward is
    written out per program (a code object of its own, as `load` gives the function: Dynamo's recompile limit is
    per code object)."""

    def __init__(self, fn: Callable[..., Any], inputs: list[torch.Tensor], held: list[int]) -> None:
        super().__init__()
        self.fn, self.held, self.n = fn, held, len(inputs)
        for i in held:
            self.register_buffer(f"b{i}", clone_tree([inputs[i]])[0])
        rest = [f"r{i}" for i in range(len(inputs)) if i not in held]
        args = [f"self.b{i}" if i in held else f"r{i}" for i in range(len(inputs))]
        source = f"def forward(self, {', '.join(rest)}):\n    return self.fn({', '.join(args)})\n"
        _count[0] += 1
        namespace: dict[str, Any] = {}
        exec(compile(source, f"<graphex fuzz module {_count[0]}>", "exec"), namespace)
        self.forward = types.MethodType(namespace["forward"], self)


def _call_held(compiled: Callable[..., Any], module: _Held, inputs: list[torch.Tensor]) -> tuple[Any, list[torch.Tensor]]:
    for i in module.held:  # the same buffer objects, back to the seed's values
        getattr(module, f"b{i}").copy_(inputs[i])
    args = clone_tree([t for i, t in enumerate(inputs) if i not in module.held])
    out = compiled(*args)
    given = iter(args)
    return out, [getattr(module, f"b{i}") if i in module.held else next(given) for i in range(len(inputs))]


def _under(backend: str, source: str, inputs: list[torch.Tensor], dynamic: bool,
           expected: tuple[Any, list[torch.Tensor]], held: Sequence[int] = ()) -> tuple[str | None, str | None]:
    try:
        if held:
            module = _Held(load(source), inputs, list(held))
            options = {"frozen_parameter": True} if backend == "graphex" else None
            compiled_module = torch.compile(module, backend=backend, fullgraph=True, dynamic=dynamic, options=options)
            call = lambda: _call_held(compiled_module, module, inputs)  # noqa: E731
        else:
            compiled = torch.compile(load(source), backend=backend, fullgraph=True, dynamic=dynamic)
            call = lambda: _call(compiled, inputs)  # noqa: E731
        first = call()
        first_diff = (difference(first[0], expected[0], "capture outputs")
                      or difference(first[1], expected[1], "capture inputs")
                      or alias_difference(first, expected, "capture outputs"))
        _overwrite(first)  # Note [What a fuzzed program must match]: nothing the caller got may reach the replay
        second = call()
    except _Timeout:
        raise
    except Exception as e:  # noqa: BLE001 - failures are data
        return _error(e), None
    return None, (first_diff or difference(second[0], expected[0], "replay outputs")
                  or difference(second[1], expected[1], "replay inputs")
                  or alias_difference(second, expected, "replay outputs"))


def _overwrite(call: tuple[Any, list[torch.Tensor]]) -> None:
    """Write every tensor the caller got back from a call (its outputs, its inputs afterwards), as a caller may:
    a result that is memory the compiled program keeps (a folded constant, a buffer it reuses) would then give the
    next call other values. Tensors with overlapping memory (expanded) cannot be written and are left alone."""
    outputs, args = call
    for t in [*(outputs if isinstance(outputs, (tuple, list)) else [outputs]), *args]:
        if not isinstance(t, torch.Tensor) or t.numel() == 0:
            continue
        try:
            t.fill_(True if t.dtype == torch.bool else 7)
        except RuntimeError:
            pass  # more than one element refers to the same memory


def check(program: Program, seed: int, time_limit: float = 30.0) -> Outcome:
    """Run `program` on the inputs of `seed` under eager and graphex (Note [What a fuzzed program must match])."""
    previous = signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, time_limit)
    try:
        with torch.no_grad():
            return _check(program.source(), make_inputs(program.inputs, seed), program.dynamic,
                          held_inputs(program.inputs, seed))
    except _Timeout:
        return Outcome("timeout", f"ran past {time_limit:g} s")
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _alarm(*_: Any) -> None:
    raise _Timeout()


def _check(source: str, inputs: list[torch.Tensor], dynamic: bool, held: Sequence[int] = ()) -> Outcome:
    try:
        expected = _call(load(source), inputs)
    except _Timeout:
        raise
    except Exception as e:  # noqa: BLE001
        return Outcome("invalid", "eager raises: " + _error(e))
    before = graphex_runs()
    error, diff = _under("graphex", source, inputs, dynamic, expected, held)
    if error is None and diff is None:
        return Outcome("ok" if graphex_runs() > before else "ok_no_engine")
    aot_error, aot_diff = _under("aot_eager", source, inputs, dynamic, expected, held)
    if aot_error is not None:
        return Outcome("not_graphex", f"aot_eager raises too: {aot_error}")
    if error is not None:
        return Outcome("graphex_error", error)
    if aot_diff is not None:
        return Outcome("as_aot_eager", f"graphex: {diff}; aot_eager: {aot_diff}")
    return Outcome("graphex_diff", diff or "")


def graphex_runs() -> int:
    import graphex

    return graphex._C.total_run_count()


def _same_failure(a: Outcome, b: Outcome) -> bool:
    if a.kind != b.kind:
        return False
    return a.kind != "graphex_error" or a.detail.split(":")[0] == b.detail.split(":")[0]


def _without(program: Program, i: int) -> Program:
    statements = program.statements[:i] + program.statements[i + 1:]
    defined = {s.split(" = ")[0] for s in statements if " = " in s}
    outputs = [o for o in program.outputs if o in defined or o.startswith("a")] or ["a0"]
    return Program(program.inputs, statements, outputs, program.dynamic)


def shrink(program: Program, seed: int, failure: Outcome, time_limit: float = 30.0) -> Program:
    """The smallest program (statements, outputs, static shapes) found that still fails the same way."""
    candidates: Callable[[Program], list[Program]] = lambda p: (
        [_without(p, i) for i in reversed(range(len(p.statements)))]
        + [Program(p.inputs, p.statements, p.outputs[:i] + p.outputs[i + 1:], p.dynamic)
           for i in range(len(p.outputs)) if len(p.outputs) > 1]
        + ([Program(p.inputs, p.statements, p.outputs, False)] if p.dynamic else []))
    improved = True
    while improved:
        improved = False
        for candidate in candidates(program):
            if _same_failure(check(candidate, seed, time_limit), failure):
                program, improved = candidate, True
                break
    return program


def write_reproducer(directory: str, program: Program, seed: int, failure: Outcome) -> str:
    """A standalone script that re-runs the program and exits 1 while it still fails."""
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, f"repro_{seed}.py")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    inputs = ", ".join(f"Input({i.shape!r}, {i.dtype!r}, {i.layout!r})" for i in program.inputs)
    text = f'''"""graphex fuzz failure (seed {seed}): {failure.kind}
{failure.detail}

Re-run: python {path}   (exit status 1 while graphex still differs from eager)
"""
import sys
sys.path.insert(0, {root!r})
from sweeps.fuzz_gen import Input, Program
from sweeps.fuzz_run import reproduce

SOURCE = """\\
{program.source()}"""
INPUTS = [{inputs}]  # shape, dtype, layout; values drawn from seed {seed}

if __name__ == "__main__":
    sys.exit(reproduce(SOURCE, INPUTS, seed={seed}, dynamic={program.dynamic!r}))
'''
    with open(path, "w") as f:
        f.write(text)
    return path


def reproduce(source: str, inputs: list[Input], *, seed: int, dynamic: bool) -> int:
    print(source)
    with torch.no_grad():
        outcome = _check(source, make_inputs(inputs, seed), dynamic, held_inputs(inputs, seed))
    print(f"{outcome.kind}: {outcome.detail}" if outcome.detail else outcome.kind)
    return 1 if outcome.kind in FAILURES else 0
