"""Checks on custom operators, each raising a CustomOpError that names the op and shows the fix.

Note [Where custom-op errors are caught]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
A missing or wrong fake function fails while Dynamo traces, before our backend
ever runs. To still explain it in the user's registration style we add one
entry to FakeTensorMode's table of special-cased operators (torch's public-ish
`register_op_impl`), consulted after a registered fake impl and before the Meta
kernel. It acts only for custom operators, and only while Dynamo traces for a
graphex backend on this thread (compat.in_graphex_trace): inductor's or anyone
else's compile sees torch's own behaviour. It either raises (no Meta at all; a
Meta that allocates on a real device) or returns NotImplemented, so it never
changes what a working op does. The error derives from Dynamo's Unsupported,
which Dynamo re-raises as is (with the user's source line).

`custom_op` ops do not reach that table: their own fake wrapper runs first and,
with no fake registered, raises torch's generic message. For them, each
CustomOpDef without a fake gets a stand-in fake for the length of a compile only:
Dynamo's public compile callbacks put the stand-ins in when its first pending
compile starts and take them out (where still ours) when its last one ends, so
outside a compile torch's registry is as the user left it (`has_fake_kernel` is
False again), and nothing is written at import or when the backend loads. A
`register_fake` during a compile replaces the stand-in as usual. The stand-in
raises graphex's error only in a graphex trace on the calling thread; in another
thread's compile it does exactly what torch does without a fake (a trivial fake
where torch makes one, else torch's error, same text). torch._dynamo.reset()
clears all compile callbacks; graphex adds its own back when its backend next
runs (and its tools do so right after the resets they make), so the first
compile after a reset that fails on a missing fake, before any graphex backend ran
again, shows torch's message instead of graphex's. torch itself is never patched
(Note [graphex never patches torch], graphex/compat/).

Schema rules (an in-place op must not return its mutated input) are checked on
the Dynamo graph at the start of our backend; the fake-vs-real comparison runs
in the engine on the first replay (option validate_fake).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.fx
from torch._dynamo.exc import Unsupported

from ..compat import in_graphex_trace, trivial_fake
from ..errors import CustomOpError, Finding
from . import fixes
from .registration import Registration, describe, is_custom


class CustomOpTraceError(CustomOpError, Unsupported):
    """A CustomOpError raised while Dynamo traces (see Note [Where custom-op errors are caught])."""

    def __init__(self, *, finding: Finding) -> None:
        Unsupported.__init__(self, finding.render(), gb_type="graphex custom op")
        self.first_useful_frame = None
        self.finding = finding


_op_impl_registered = False


def install_trace_checks() -> None:
    """Add graphex's custom-op checks to fake tensor propagation; idempotent, cheap (see the Note).

    Called when the backend loads and whenever a graphex backend runs, so the compile
    callbacks come back after torch._dynamo.reset().
    """
    global _op_impl_registered
    if not _op_impl_registered:
        from torch._subclasses.fake_impls import register_op_impl

        register_op_impl(_needs_check)(_check_fake_dispatch)
        _op_impl_registered = True
    handler = torch._dynamo.callback.callback_handler
    if _stand_in_missing_fakes not in handler.start_callbacks:
        handler.register_start_callback(_stand_in_missing_fakes)
    if _take_stand_ins_out not in handler.end_callbacks:
        handler.register_end_callback(_take_stand_ins_out)


def reset_dynamo() -> None:
    """torch._dynamo.reset(), then graphex's compile callbacks back (what graphex's tools use between runs)."""
    torch._dynamo.reset()
    install_trace_checks()


def _stand_in_missing_fakes(*_: Any) -> None:
    from torch._library.custom_ops import OPDEFS

    for opdef in list(OPDEFS.values()):
        if getattr(opdef, "_abstract_fn", "absent") is None:
            opdef._abstract_fn = _MissingFake(opdef)


def _take_stand_ins_out(*_: Any) -> None:
    """The last pending compile ended: each stand-in still in place goes (see the Note)."""
    from torch._library.custom_ops import OPDEFS

    for opdef in list(OPDEFS.values()):
        if isinstance(getattr(opdef, "_abstract_fn", None), _MissingFake):
            opdef._abstract_fn = None


class _MissingFake:
    """Stands in for the fake of a custom_op that has none, to raise a teaching error (see the Note)."""

    def __init__(self, opdef: Any) -> None:
        self.opdef = opdef

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        op = self.opdef._opoverload
        trivial, result = trivial_fake(op, args, kwargs)
        if trivial:
            return result
        if in_graphex_trace():
            raise _missing_fake_error(op)
        # Not graphex's compile: torch's own message (torch/_library/custom_ops.py, 2.4+).
        raise RuntimeError(
            f"There was no fake impl registered for {self.opdef}. This is necessary for torch.compile/export/fx "
            f"tracing to work. Please use `{self.opdef._init_fn.__name__}.register_fake` to add an fake impl.")


def _missing_fake_error(op: torch._ops.OpOverload) -> CustomOpTraceError:
    reg = describe(op)
    what = "has no fake function" if reg.style == "custom_op" else "has no fake (Meta) function"
    return CustomOpTraceError(finding=_finding(
        reg, what,
        "torch.compile traces with fake tensors, which carry shapes but no data; it needs a function "
        "that says what shape, dtype and device the op returns",
        fixes.missing_fake(reg)))


def _needs_check(func: Any) -> bool:
    return is_custom(func) and in_graphex_trace()


def _check_fake_dispatch(fake_mode: Any, func: torch._ops.OpOverload, *args: Any, **kwargs: Any) -> Any:
    from torch._library.utils import can_generate_trivial_fake_impl
    from torch._subclasses.fake_impls import has_meta
    from torch._subclasses.fake_tensor import in_kernel_invocation_manager

    if not has_meta(func):
        if can_generate_trivial_fake_impl(func):
            return NotImplemented
        raise _missing_fake_error(func)
    with in_kernel_invocation_manager(fake_mode):
        try:
            out = func(*args, **kwargs)
        except NotImplementedError:  # only the Meta backend fallback: nothing registered
            if can_generate_trivial_fake_impl(func):
                return NotImplemented
            raise _missing_fake_error(func) from None
        # Inside the kernel invocation, a fake tensor reports `meta`; anything else is a real tensor.
        devices = [t.device for t in _tensors(out)]
    for device in devices:
        if device.type != "meta":
            reg = describe(func)
            raise CustomOpTraceError(finding=_finding(
                reg, f"has a Meta function that returns a tensor on '{device}'",
                "a Meta/fake function must allocate its outputs on the `meta` device (like its inputs), "
                "never on a real device: it only describes shapes and must not touch memory",
                fixes.meta_on_real_device(reg, str(device))))
    return NotImplemented


def check_dynamo_graph(gm: torch.fx.GraphModule) -> None:
    """Schema rules for every custom op in a Dynamo graph; raises CustomOpError on the first violation."""
    seen: set[str] = set()
    for node in gm.graph.nodes:
        if node.op != "call_function":
            continue
        for op in _overloads(node.target):
            if not is_custom(op) or op.name() in seen:
                continue
            seen.add(op.name())
            for output, ret in enumerate(op._schema.returns):
                if ret.alias_info is None:
                    continue
                reg = describe(op)
                if ret.alias_info.is_write:
                    problem = "returns its mutated input"
                    why = ("since PyTorch 2.6, auto-functionalization requires in-place custom ops to return "
                           "nothing for the arguments they mutate: the caller already holds that tensor")
                    fix = fixes.no_mutated_return(reg)
                else:
                    problem = "returns an alias of an input"
                    why = ("graph mode needs outputs that do not share memory with inputs; return a new tensor "
                           "(e.g. `.clone()`) and remove the alias annotation from the return")
                    fix = fixes.return_clone(reg, output, _aliased_argument(op._schema, ret))
                raise CustomOpError(finding=_finding(reg, f"{problem} (schema: {op._schema})", why, fix, node=node))


def _aliased_argument(schema: torch._C.FunctionSchema, ret: Any) -> str:
    """The name of the argument a return aliases (same alias set), for the fix."""
    for arg in schema.arguments:
        if arg.alias_info is not None and arg.alias_info.before_set == ret.alias_info.before_set:
            return arg.name
    return "x"


def explain_fake_mismatch(op: torch._ops.OpOverload, node_name: str, output: int, expected: str,
                          actual: str, source: str) -> CustomOpError:
    reg = describe(op)
    return CustomOpError(finding=_finding(
        reg, f"has a fake/Meta function that disagrees with its real kernel (node '{node_name}', output {output}: "
             f"fake {expected}, real {actual})",
        "ops after it were planned with the fake's shape; the replay would compute garbage or fail. "
        "Checked on the first run; disable with options={'validate_fake': False}",
        fixes.fake_mismatch(reg, output, expected, actual), source=source))


def _finding(reg: Registration, problem: str, why: str, fix: str, node: torch.fx.Node | None = None,
             source: str = "") -> Finding:
    from ..base.source import source_line

    style = {"custom_op": "torch.library.custom_op", "library": "torch.library.Library",
             "cpp": "C++ TORCH_LIBRARY"}[reg.style]
    return Finding(what=f"custom op {reg.qualname} {problem}",
                   where=source or (source_line(node) if node is not None else ""), why=why, fix=fix,
                   op=reg.qualname, node=node.name if node is not None else "",
                   detail=f"registered with {style}{reg.where()}")


def _tensors(out: Any) -> list[torch.Tensor]:
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, (list, tuple)):
        return [t for o in out for t in _tensors(o)]
    return []


def _overloads(target: Any) -> list[torch._ops.OpOverload]:
    if isinstance(target, torch._ops.OpOverload):
        return [target]
    if isinstance(target, torch._ops.OpOverloadPacket):
        return [getattr(target, name) for name in target.overloads()]
    return []
