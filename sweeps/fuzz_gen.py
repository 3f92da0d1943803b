"""Random programs for the differential fuzzer, as Python source over a fixed menu of ops.

A program is its inputs (shape, dtype, layout each) and a list of statements, each one line of Python
that defines at most one new value; `source()` renders `def program(a0, a1, ...)`. The generator tracks
each value's shape and dtype (and whether it is an input or a view of one, and whether it may be written)
so that almost every program is valid in eager; one that is not is skipped by the runner.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, field
from typing import Callable

DTYPES = ("float32", "float32", "float32", "float16", "bfloat16", "int64")
LAYOUTS = ("contiguous", "contiguous", "transposed", "sliced", "expanded")


@dataclass
class Value:
    name: str
    shape: tuple[int, ...]
    dtype: str
    writable: bool = True   # no overlapping memory (expanded), so in-place writes are allowed
    root: str = ""  # the value whose memory it shares (itself for an input or a fresh tensor)

    @property
    def floating(self) -> bool:
        return self.dtype != "int64"


@dataclass
class Input:
    shape: tuple[int, ...]
    dtype: str
    layout: str


@dataclass
class Program:
    inputs: list[Input]
    statements: list[str]
    outputs: list[str]
    dynamic: bool = False

    def source(self) -> str:
        args = ", ".join(f"a{i}" for i in range(len(self.inputs)))
        body = [f"    {s}" for s in self.statements] or ["    pass"]
        return "\n".join([f"def program({args}):", *body, f"    return ({', '.join(self.outputs)},)", ""])


@dataclass
class _State:
    rng: random.Random
    values: list[Value] = field(default_factory=list)
    statements: list[str] = field(default_factory=list)
    counter: int = 0

    def new(self, shape: tuple[int, ...], dtype: str, line: str, *, view_of: Value | None = None,
            writable: bool = True) -> Value:
        name = f"v{self.counter}"
        self.counter += 1
        value = Value(name, tuple(shape), dtype, writable and (view_of is None or view_of.writable),
                      view_of.root if view_of is not None else name)
        self.statements.append(line.format(y=name))
        self.values.append(value)
        return value

    def pick(self, want: Callable[[Value], bool] = lambda v: True) -> Value | None:
        fits = [v for v in self.values if want(v)]
        return self.rng.choice(fits) if fits else None


def generate(seed: int, max_statements: int = 8) -> Program:
    rng = random.Random(seed)
    state = _State(rng)
    inputs = []
    for i in range(rng.randint(1, 3)):
        first = state.values[0] if state.values else None
        if first is not None and first.shape and rng.random() < 0.2:
            # an input that is a view of input 0: the caller passes aliasing tensors (a cache and a page of it)
            layout = rng.choice(("alias_slice", "alias_select"))
            shape = (first.shape[0] - 1, *first.shape[1:]) if layout == "alias_slice" else first.shape[1:]
            if layout == "alias_select" and first.shape[0] == 0:
                layout, shape = "alias_slice", (0, *first.shape[1:])
            inputs.append(Input(shape, first.dtype, layout))
            state.values.append(Value(f"a{i}", shape, first.dtype, first.writable, "a0"))
            continue
        shape = _shape(rng) if i == 0 or rng.random() < 0.4 else state.values[0].shape
        inp = Input(shape, rng.choice(DTYPES), rng.choice(LAYOUTS) if shape else "contiguous")
        inputs.append(inp)
        state.values.append(Value(f"a{i}", shape, inp.dtype, inp.layout != "expanded", f"a{i}"))
    for _ in range(rng.randint(2, max_statements)):
        for _attempt in range(5):
            if rng.choice(GENERATORS)(state):
                break
    # the values nothing later reads (so little is dead code), at most 4, the latest first
    produced = [v.name for v in state.values if not v.name.startswith("a")]
    read = {w for line in state.statements for w in _words(line.split(" = ", 1)[-1])}
    sinks = [name for name in produced if name not in read] or produced[-1:]
    outputs = sinks[-4:] if sinks else ["a0"]
    return Program(inputs, state.statements, outputs, dynamic=rng.random() < 0.25)


def _words(text: str) -> set[str]:
    return set("".join(c if c.isalnum() or c == "_" else " " for c in text).split())


def _shape(rng: random.Random) -> tuple[int, ...]:
    return tuple(rng.choice((0, 1, 2, 3, 3, 4, 5)) if rng.random() < 0.15 else rng.randint(1, 5)
                 for _ in range(rng.randint(0, 3)))


def _same_or_scalar(state: _State, x: Value) -> str:
    other = state.pick(lambda v: v.shape == x.shape and v.name != x.name)
    if other is not None and state.rng.random() < 0.7:
        return other.name
    return state.rng.choice(("2", "-1", "0.5", "3")) if x.floating else state.rng.choice(("2", "-1", "3"))


def unary(state: _State) -> bool:
    x = state.pick()
    assert x is not None
    ops = ["torch.neg({x})", "torch.abs({x})", "torch.relu({x})", "({x} * 3)", "({x} + 1)",
           "{x}.clamp(min=-1, max=2)"]
    if x.floating:
        ops += ["torch.sigmoid({x})", "torch.tanh({x})", "torch.exp({x})", "torch.sin({x})", "torch.sqrt({x}.abs())"]
    state.new(x.shape, x.dtype, "{y} = " + state.rng.choice(ops).format(x=x.name))
    return True


def binary(state: _State) -> bool:
    x = state.pick()
    assert x is not None
    y = _same_or_scalar(state, x)
    other = next((v for v in state.values if v.name == y), None)
    dtype = x.dtype if other is None or other.dtype == x.dtype else _promote(x.dtype, other.dtype)
    if other is None and "." in y and not x.floating:
        dtype = "float32"
    op = state.rng.choice(["torch.add({x}, {o})", "torch.mul({x}, {o})", "({x} - {o})", "torch.where({x} > 0, {x}, {o})"]
                          + (["torch.maximum({x}, {o})"] if other is not None else []))
    state.new(x.shape, dtype, "{y} = " + op.format(x=x.name, o=y))
    return True


def _promote(a: str, b: str) -> str:
    if "int64" in (a, b):
        return b if a == "int64" else a
    if a == b:
        return a
    return "float32"  # float16 with bfloat16, or with float32


def reduction(state: _State) -> bool:
    x = state.pick(lambda v: len(v.shape) >= 1)
    if x is None:
        return False
    d = state.rng.randrange(len(x.shape))
    keep = state.rng.random() < 0.3
    rest = tuple(1 if i == d else s for i, s in enumerate(x.shape) if keep or i != d)
    choice = state.rng.choice(["sum", "amax", "mean", "cumsum", "all"])
    if choice == "amax" and x.shape[d] == 0 or choice == "mean" and not x.floating:
        choice = "sum"
    if choice == "cumsum":
        state.new(x.shape, x.dtype, f"{{y}} = {x.name}.cumsum({d})")
    elif choice == "all":
        state.new((), x.dtype if x.floating else "int64", f"{{y}} = {x.name}.sum()")
    else:
        state.new(rest, x.dtype, f"{{y}} = {x.name}.{choice}({d}, keepdim={keep})")
    return True


def view(state: _State) -> bool:
    x = state.pick()
    assert x is not None
    r, s = state.rng, x.shape
    options: list[tuple[str, tuple[int, ...], bool]] = [(f"{x.name}.unsqueeze(0)", (1, *s), True),
                                                         (f"{x.name}.reshape(-1)", (_numel(s),), True)]
    if len(s) >= 2:
        options += [(f"{x.name}.transpose(0, 1)", (s[1], s[0], *s[2:]), True),
                    (f"{x.name}.diagonal()", (*s[2:], min(s[0], s[1])), True)]
    if len(s) >= 1:
        options += [(f"{x.name}[1:]", (max(s[0] - 1, 0), *s[1:]), True),
                    (f"{x.name}[..., ::2]", (*s[:-1], (s[-1] + 1) // 2), True),
                    (f"{x.name}.expand(2, *{x.name}.shape)", (2, *s), False)]
        if s[0] > 0:
            i = r.randrange(s[0])
            options.append((f"{x.name}.select(0, {i})", s[1:], True))
    expr, shape, writable = r.choice(options)
    # reshape may or may not copy: counted as a view (it may share memory), never written through
    state.new(shape, x.dtype, "{y} = " + expr, view_of=x, writable=writable and "reshape" not in expr)
    return True


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def inplace(state: _State) -> bool:
    t = state.pick(lambda v: v.writable)
    if t is None:
        return False
    other = state.pick(lambda v: v.shape == t.shape and v.name != t.name)
    r = state.rng
    ops = [f"{t.name}.mul_(2)", f"{t.name}.add_(1)", f"{t.name}.clamp_(min=0)", f"{t.name}.zero_()",
           f"torch.ops.graphex_fuzz.add_one_({t.name})"]
    if other is not None and other.root != t.root:  # never read memory the write overlaps
        ops += [f"{t.name}.add_({other.name}.to({t.name}.dtype))", f"{t.name}.copy_({other.name})"]
    state.statements.append(r.choice(ops))
    return True


def indexing(state: _State) -> bool:
    x = state.pick(lambda v: len(v.shape) >= 1 and v.shape[0] >= 1)
    if x is None:
        return False
    r, n = state.rng, x.shape[0]
    k = r.randint(1, n)
    idx = r.sample(range(n), k)
    index = f"torch.tensor({idx})"
    src = f"({x.name}[:{k}] * 2)"
    kind = r.choice(["index_put", "index_copy", "scatter", "index_put_", "index_copy_"])
    if kind.endswith("_") and not x.writable:
        kind = kind[:-1]
    if kind == "index_put":
        state.new(x.shape, x.dtype, f"{{y}} = {x.name}.index_put(({index},), {src})")
    elif kind == "index_put_":
        acc = r.random() < 0.5
        state.statements.append(f"{x.name}.index_put_(({index},), {src}.clone(), accumulate={acc})")
    elif kind == "index_copy":
        state.new(x.shape, x.dtype, f"{{y}} = {x.name}.index_copy(0, {index}, {src})")
    elif kind == "index_copy_":
        state.statements.append(f"{x.name}.index_copy_(0, {index}, {src}.clone())")
    else:
        perm = r.sample(range(n), n)
        view = ", ".join(["-1"] + ["1"] * (len(x.shape) - 1))
        add = r.choice(["scatter", "scatter_add"])
        state.new(x.shape, x.dtype, f"{{y}} = {x.name}.{add}(0, torch.tensor({perm}).view({view})"
                                    f".expand({x.name}.shape), {x.name} * 3)")
    return True


def cat_split(state: _State) -> bool:
    x = state.pick(lambda v: len(v.shape) >= 1)
    if x is None:
        return False
    r = state.rng
    if r.random() < 0.5:
        y = state.pick(lambda v: v.shape[1:] == x.shape[1:] and len(v.shape) == len(x.shape) and v.dtype == x.dtype)
        assert y is not None  # x itself at least
        state.new((x.shape[0] + y.shape[0], *x.shape[1:]), x.dtype, f"{{y}} = torch.cat([{x.name}, {y.name}], 0)")
    else:
        size = r.randint(1, 3)
        chunks = max(1, -(-x.shape[0] // size))
        i = r.randrange(chunks)
        length = min(size, x.shape[0] - size * i) if x.shape[0] else 0
        state.new((length, *x.shape[1:]), x.dtype, f"{{y}} = {x.name}.split({size}, 0)[{i}]", view_of=x)
    return True


def matmul(state: _State) -> bool:
    x = state.pick(lambda v: len(v.shape) == 2 and v.dtype in ("float32", "bfloat16"))
    if x is None:
        return False
    y = state.pick(lambda v: len(v.shape) == 2 and v.shape[0] == x.shape[1] and v.dtype == x.dtype)
    if y is not None and state.rng.random() < 0.6:
        state.new((x.shape[0], y.shape[1]), x.dtype, f"{{y}} = {x.name} @ {y.name}")
    else:
        state.new((x.shape[0], x.shape[0]), x.dtype, f"{{y}} = torch.mm({x.name}, {x.name}.t())")
    return True


def snapshot(state: _State) -> bool:
    """A copy of a value, often of one the program writes later (an input, a view of one): it must keep the values
    it had (a helper found `x[0].zero_(); snap = x.clone(); x[1].zero_()` returning the second write in snap)."""
    x = state.pick()
    assert x is not None
    form = state.rng.choice(("{x}.clone()", "torch.clone({x})", "{x}.detach().clone()", "{x}.contiguous().clone()"))
    state.new(x.shape, x.dtype, "{y} = " + form.format(x=x.name))
    return True


def factory(state: _State) -> bool:
    """A value made inside the program, from nothing the caller passed: a factory call or a tensor constant, often
    combined with an input, viewed, written or returned (graphex computes such chains once: Note [Folding what
    reads no input])."""
    rng = state.rng
    shape = rng.choice([v.shape for v in state.values] + [_shape(rng)])
    dtype = rng.choice(DTYPES)
    torch_dtype = f"torch.{dtype}"
    n = _numel(shape)
    forms = [f"torch.ones({shape}, dtype={torch_dtype})", f"torch.zeros({shape}, dtype={torch_dtype})",
             f"torch.full({shape}, 3, dtype={torch_dtype})",
             f"torch.arange({n}, dtype={torch_dtype}).reshape({shape})",
             f"(torch.arange({n}) % 3).to({torch_dtype}).reshape({shape})",
             f"torch.tensor({[rng.randint(-3, 3) for _ in range(n)]}, dtype={torch_dtype}).reshape({shape})"]
    state.new(shape, dtype, "{y} = " + rng.choice(forms))
    return True


def custom(state: _State) -> bool:
    x = state.pick()
    assert x is not None
    state.new(x.shape, x.dtype, f"{{y}} = torch.ops.graphex_fuzz.scale({x.name}, {state.rng.randint(-2, 3)})")
    return True


GENERATORS = (unary, unary, binary, binary, reduction, view, view, inplace, inplace, indexing, indexing,
              cat_split, matmul, custom, snapshot, factory)


def merge(programs: list[Program]) -> Program:
    """Several programs as one (names prefixed p0_, p1_, ...; inputs, statements and outputs side by side):
    one Dynamo compile checks them all. An alias input stays a view of its own program's first input."""
    inputs: list[Input] = []
    statements: list[str] = []
    outputs: list[str] = []
    for k, program in enumerate(programs):
        offset = len(inputs)
        rename = lambda text, k=k, offset=offset: re.sub(  # noqa: E731
            r"\b([av])(\d+)\b", lambda m: f"a{int(m.group(2)) + offset}" if m.group(1) == "a" else f"p{k}_v{m.group(2)}", text)
        inputs += [Input(i.shape, i.dtype, i.layout if not i.layout.startswith("alias") else f"{i.layout}@{offset}")
                   for i in program.inputs]
        statements += [rename(line) for line in program.statements]
        outputs += [rename(name) for name in program.outputs]
    return Program(inputs, statements, outputs, dynamic=programs[0].dynamic if programs else False)
