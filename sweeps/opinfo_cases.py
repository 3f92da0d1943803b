"""Which OpInfo samples the sweep runs, each as a function of its tensor arguments only.

A case is one (op, dtype, static or dynamic, sample index); its id, e.g. `add/float32/static/0`,
re-runs it alone: `python -m sweeps.opinfo --case add/float32/static/0`.
"""

from __future__ import annotations

import itertools
import types
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence

import torch
from torch.utils import _pytree as pytree

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16, "int64": torch.int64}


def op_db() -> list[Any]:
    try:
        from torch.testing._internal.common_methods_invocations import op_db as db
    except ModuleNotFoundError as e:  # torch's test helpers import expecttest, not a torch dependency
        raise SystemExit(f"the OpInfo sweep needs {e.name}: pip install {e.name} (make build installs it)") from e

    return list(db)


def op_name(op: Any) -> str:
    return op.name + (f".{op.variant_test_name}" if op.variant_test_name else "")


@dataclass
class Case:
    op: Any
    dtype: str
    dynamic: bool
    index: int
    sample: Any

    @property
    def id(self) -> str:
        return f"{op_name(self.op)}/{self.dtype}/{'dynamic' if self.dynamic else 'static'}/{self.index}"

    def tensors(self) -> list[torch.Tensor]:
        return [x for x in pytree.tree_leaves(self._packed()) if isinstance(x, torch.Tensor)]

    def _packed(self) -> Any:
        return (self.sample.input, tuple(self.sample.args), dict(self.sample.kwargs))

    def function(self, tag: str) -> Callable[..., Any]:
        """`fn(*tensors)` calling the op on this sample; a fresh code object per call (named after the
        case), so Dynamo compiles each case and backend on its own without hitting its recompile limit."""
        leaves, spec = pytree.tree_flatten(self._packed())
        slots = [i for i, x in enumerate(leaves) if isinstance(x, torch.Tensor)]
        constants = [None if isinstance(x, torch.Tensor) else x for x in leaves]
        call = _unseeded(self.op.op)

        def run(*tensors: torch.Tensor) -> Any:
            filled = list(constants)
            for slot, t in zip(slots, tensors):
                filled[slot] = t
            inp, args, kwargs = pytree.tree_unflatten(filled, spec)
            return call(inp, *args, **kwargs)

        safe = "".join(c if c.isalnum() else "_" for c in f"{self.id}_{tag}")
        run.__code__ = run.__code__.replace(co_name=safe)
        run.__name__ = run.__qualname__ = safe
        return run


def _unseeded(fn: Callable[..., Any]) -> Callable[..., Any]:
    """OpInfo wraps random ops in `wrapper_set_seed`, which Dynamo cannot trace (it saves the generator's state);
    the sweep seeds the default generator before every run instead, so the wrapper becomes a plain call."""
    code = getattr(fn, "__code__", None)
    if code is None or "wrapper_set_seed" not in code.co_names:
        return fn
    namespace = dict(fn.__globals__)
    namespace["wrapper_set_seed"] = lambda f, *args, **kwargs: f(*args, **kwargs)
    return types.FunctionType(code, namespace, fn.__name__, fn.__defaults__, fn.__closure__)


def dtypes_of(op: Any, wanted: Sequence[str]) -> list[str]:
    supported = op.supported_dtypes("cpu")
    return [name for name in wanted if DTYPES[name] in supported]


def cases(ops: Sequence[Any], dtypes: Sequence[str], modes: Sequence[bool], samples: int) -> Iterator[Case]:
    """Every (op, supported dtype, mode, sample) in a fixed order; a sample generator that fails yields nothing."""
    for op in ops:
        for dtype in dtypes_of(op, dtypes):
            try:
                drawn = list(itertools.islice(op.sample_inputs("cpu", DTYPES[dtype], requires_grad=False), samples))
            except Exception:  # noqa: BLE001 - OpInfo's own sample generator failing is not graphex's business
                continue
            for dynamic in modes:
                for index, sample in enumerate(drawn):
                    yield Case(op, dtype, dynamic, index, sample)


def select(ops: Sequence[Any], names: Sequence[str] | None, shard: tuple[int, int] | None) -> list[Any]:
    """Ops named in `names` (all when None), then every shard[1]-th one starting at shard[0] (a deterministic fraction)."""
    chosen = [op for op in ops if not names or op_name(op) in names or op.name in names]
    if shard is not None:
        chosen = chosen[shard[0]::shard[1]]
    return chosen
