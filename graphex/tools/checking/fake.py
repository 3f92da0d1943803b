"""Checks 1, 2 and 5: the op has a fake, the fake agrees with the real kernel, the fake reads no data.

The fake runs the way torch.compile runs it for graphex: the op called under
FakeTensorMode on fakes of the recorded inputs, with a ShapeEnv that allows
data-dependent output sizes (fullgraph does) but not reading a value (.item(),
.tolist(), numpy): that raises, and is check 5. Before that it is called once on `meta`
tensors, outside any mode: a fake that allocates on a real device (a Meta
function returning `torch.empty(shape)`) shows up there as a non-meta output,
while under FakeTensorMode its factory call would quietly be faked.

What check 2 compares, per output: the structure (how many outputs, tensor or
not), shape, dtype, device type; strides only where the real kernel promises
them, i.e. when the real output is contiguous or the fake claims a
non-contiguous layout, and only for dims with more than one element.
"""

from __future__ import annotations

import re
from typing import Any, Callable

import torch

from graphex.custom_ops import fixes
from graphex.custom_ops.registration import Registration

from . import values
from .propose import Proposal
from .record import Call
from .report import Problem

_DATA_ACCESS = re.compile(r"item\(\)|tolist|_local_scalar_dense|data pointer|data_ptr|numpy|"
                          r"cannot be called on meta tensors|data-dependent|data dependent|storage",
                          re.IGNORECASE)


_STYLE = {"custom_op": "torch.library.custom_op", "library": "torch.library.Library", "cpp": "C++ TORCH_LIBRARY"}


def fake_source(op: torch._ops.OpOverload) -> str | None:
    """Where the op's fake comes from, or None when it has none."""
    from torch._library import simple_registry
    from torch._library.custom_ops import OPDEFS
    from torch._library.utils import can_generate_trivial_fake_impl

    opdef = OPDEFS.get(op._schema.name)
    if opdef is not None:
        fn = getattr(opdef, "_abstract_fn", None)
        if fn is not None and type(fn).__name__ != "_MissingFake":  # graphex's stand-in is not a fake
            return "register_fake"
    else:
        for key in ("Meta", "CompositeExplicitAutograd", "CompositeImplicitAutograd"):
            if torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), key):
                return f"a {key} kernel"
        if simple_registry.singleton.find(op.name()).fake_impl.kernel is not None:
            return "torch.library.register_fake"
    if can_generate_trivial_fake_impl(op):
        return "none needed: it returns nothing"
    return None


def check_exists(call: Call, reg: Registration, proposal: Callable[[], Proposal]) -> list[Problem]:
    if fake_source(call.op) is not None:
        return []
    p = proposal()
    return [Problem(call.op.name(), "fake_exists", call.case_id,
                    "a fake (Meta) function: torch.compile traces with fake tensors, which have shapes but no data",
                    f"none registered for {call.op.name()} ({_STYLE[reg.style]}"
                    + (f", defined at {reg.defined_at})" if reg.defined_at else ")"),
                    fixes.missing_fake(reg, body=p.body, unknown=p.unknown), note=p.note())]


def check_fake(call: Call, reg: Registration, proposal: Callable[[], Proposal]) -> list[Problem]:
    """Checks 2 and 5 on one recorded call."""
    op, name = call.op, call.op.name()
    try:
        meta_out = op(*values.to_meta(call.args), **values.to_meta(call.kwargs))
    except Exception:  # noqa: BLE001  (meta tensors refuse more than fake ones; FakeTensorMode decides below)
        meta_out = None
    real_devices = sorted({t.device.type for t in values.tensors(meta_out) if t.device.type != "meta"})
    if real_devices:
        return [Problem(name, "fake_matches", call.case_id,
                        "outputs on the inputs' device (for `meta` inputs: `meta`): a fake only describes tensors",
                        f"the fake allocates on '{real_devices[0]}' (called with meta inputs)",
                        fixes.meta_on_real_device(reg, real_devices[0]))]
    try:
        fake_out = _run_under_fake_mode(call)
    except Exception as e:  # noqa: BLE001
        if _reads_data(e):
            return [_reads_data_problem(call, reg, e)]
        fix, note = _fix(reg, proposal, None)
        return [Problem(name, "fake_matches", call.case_id, "the fake runs on fake tensors of the recorded inputs",
                        f"it raised {type(e).__name__}: {_first_line(e)}", fix, note)]
    problems = []
    for i, expected, seen in _differences(call.outputs, fake_out):
        fix, note = _fix(reg, proposal, (i, seen, expected))
        problems.append(Problem(name, "fake_matches", call.case_id, f"output {i}: {expected} (the real kernel)",
                                f"output {i}: {seen} (the fake)", fix, note))
    return problems[:1]


def _run_under_fake_mode(call: Call) -> Any:
    """As Dynamo runs it for graphex (fullgraph): static input shapes, and data-dependent output
    sizes allowed (new_dynamic_size(), nonzero()); but no scalar reads, so .item() raises."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    shape_env = ShapeEnv(allow_scalar_outputs=False, allow_dynamic_output_shape_ops=True)
    with FakeTensorMode(shape_env=shape_env, static_shapes=True) as mode:
        args = values.map_tensors(mode.from_tensor, call.args)
        kwargs = values.map_tensors(mode.from_tensor, call.kwargs)
        return call.op(*args, **kwargs)


def _differences(real: Any, fake: Any) -> list[tuple[int, str, str]]:
    real_list, fake_list = values.outputs_list(real), values.outputs_list(fake)
    if len(real_list) != len(fake_list):
        return [(0, f"{len(real_list)} output(s): {values.short(real)}", f"{len(fake_list)}: {values.short(fake)}")]
    found = []
    for i, (r, f) in enumerate(zip(real_list, fake_list)):
        rs, fs = values.tensors(r), values.tensors(f)
        if isinstance(r, torch.Tensor) != isinstance(f, torch.Tensor) or len(rs) != len(fs):
            found.append((i, values.short(r), values.short(f)))
            continue
        for rt, ft in zip(rs, fs):
            if _describe(rt, ft) != _describe(ft, rt):
                found.append((i, _describe(rt, ft), _describe(ft, rt)))
                break
    return found


def _describe(t: torch.Tensor, other: torch.Tensor) -> str:
    """shape, dtype, device type; strides when they are compared (see the module note). A size the
    fake leaves data-dependent (an unbacked SymInt) matches any real size."""
    shape = [(s if isinstance(s, torch.SymInt) else o) if isinstance(s, torch.SymInt) or isinstance(o, torch.SymInt)
             else s for s, o in zip(t.shape, other.shape)] if t.dim() == other.dim() else list(t.shape)
    dtype = values.short(t).split("[")[0]
    text = f"{dtype}[{', '.join(str(s) for s in shape)}] on {t.device.type}"
    if any(isinstance(s, torch.SymInt) for s in (*t.shape, *other.shape)):
        return text
    if t.shape == other.shape and t.dtype == other.dtype and t.device.type == other.device.type:
        real, fake = (t, other) if not isinstance(t, torch._subclasses.FakeTensor) else (other, t)
        compare = real.is_contiguous() or not fake.is_contiguous()
        if compare and not values.strides_agree(t.shape, real.stride(), fake.stride()):
            text += f", strides {tuple(t.stride())}"
    return text


def _fix(reg: Registration, proposal: Callable[[], Proposal], mismatch: tuple[int, str, str] | None,
         ) -> tuple[str, str]:
    """(code, note): the inferred fake when a rule fits, else the generic advice."""
    p = proposal()
    if p.body is not None:
        return fixes.missing_fake(reg, body=p.body), "replace the fake; " + p.note()
    if mismatch is not None:
        return fixes.fake_mismatch(reg, mismatch[0], mismatch[1], mismatch[2]), p.note()
    return fixes.missing_fake(reg, unknown=p.unknown), p.note()


def _reads_data(e: BaseException) -> bool:
    from torch._subclasses.fake_tensor import DataDependentOutputException, DynamicOutputShapeException

    kinds = (DataDependentOutputException, DynamicOutputShapeException)
    try:
        from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode
        kinds += (GuardOnDataDependentSymNode,)
    except ImportError:
        pass
    return isinstance(e, kinds) or bool(_DATA_ACCESS.search(str(e)))


def _reads_data_problem(call: Call, reg: Registration, e: BaseException) -> Problem:
    return Problem(call.op.name(), "fake_reads_no_data", call.case_id,
                   "a fake that computes outputs from shapes only (fake tensors have no data)",
                   f"it reads tensor data: {type(e).__name__}: {_first_line(e)}", fixes.fake_reads_data(reg))


def _first_line(e: BaseException) -> str:
    lines = [line for line in str(e).strip().splitlines() if line.strip()]
    return lines[0][:300] if lines else ""
