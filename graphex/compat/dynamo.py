"""Dynamo's internals: the backend tracing on this thread, its config, sources, guards and side effects."""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable

import torch


# -- Dynamo: which backend is tracing on this thread ----------------------------------------------

def current_dynamo_backend() -> Callable[..., Any] | None:
    """The backend of the Dynamo trace running on this thread, unwrapped, or None outside a trace.

    Dynamo keeps the instruction translator of the frame it traces in a thread-local
    (`InstructionTranslator.current_tx()`, 2.1+); its output graph holds the backend,
    wrapped by torch.compile (`_TorchCompileWrapper.compiler_fn`), by the debug wrapper
    (`_torchdynamo_orig_backend`) and by partials.
    """
    from torch._dynamo import symbolic_convert

    tx = getattr(symbolic_convert.tls, "current_tx", None)
    fn = getattr(getattr(tx, "output", None), "compiler_fn", None)
    for _ in range(16):  # unwrap, bounded
        if fn is None:
            return None
        inner = (getattr(fn, "_torchdynamo_orig_backend", None) or getattr(fn, "compiler_fn", None)
                 or (fn.func if isinstance(fn, functools.partial) else None) or getattr(fn, "__wrapped__", None))
        if inner is None or inner is fn:
            return fn
        fn = inner
    return fn


def in_graphex_trace() -> bool:
    """True while Dynamo traces, on this thread, for a graphex backend (Note [graphex never patches torch])."""
    return bool(getattr(current_dynamo_backend(), "_graphex_backend", False))


def raised_by_traced_code(error: BaseException) -> bool:
    """Dynamo's error for a traced function that raises an exception it does not catch itself ("Observed exception",
    the same in 2.11-2.15): called eagerly, the function raises that exception (the user's own, naming its cause)."""
    from torch._dynamo import exc

    return isinstance(error, exc.Unsupported) and getattr(error, "gb_type", None) == "Observed exception"


def recompile_limit() -> int:
    """Dynamo's per-code recompile limit (config `recompile_limit`; called `cache_size_limit` before 2.6)."""
    config = torch._dynamo.config
    return int(getattr(config, "recompile_limit", getattr(config, "cache_size_limit", 8)))


# -- Dynamo's sources and guards (cache_compile: Note [cache_compile keys on what the trace read]) ----------------

def source_name(source: Any) -> str:
    """A Dynamo Source's access path (`L['func'].__self__.scale`). A method up to torch 2.11 (`source.name()`),
    a cached property since 2.12."""
    name = source.name
    return name() if callable(name) else name


def guard_recorder(on_guards: Callable[[list[Any]], None]) -> dict[str, Any]:
    """torch.compile options that hand Dynamo's guards (GuardFilterEntry: name, value, guard_type, orig_guard)
    to `on_guards` and keep every one. `guard_filter_fn` is torch.compile's public option (since 2.6)."""
    def keep_all(entries: Any) -> list[bool]:
        on_guards(list(entries))
        return [True] * len(entries)

    return {"guard_filter_fn": keep_all}


def treespec_children(spec: Any) -> list[Any]:
    """A TreeSpec's child specs: `children()` (2.13 deprecates the `children_specs` attribute)."""
    children = getattr(spec, "children", None)
    return list(children()) if callable(children) else list(spec.children_specs)


def opaque_guard_fn(cls: type) -> Callable[[Any], Any] | None:
    """The guard_fn torch registered for an opaque object type (a ProcessGroup: OPAQUE_OBJ_GUARD_FN_MATCH guards
    compare what it returns), or None. torch._library.opaque_object exists where Dynamo emits that guard."""
    try:
        from torch._library.opaque_object import get_opaque_obj_info
    except ImportError:
        return None
    info = get_opaque_obj_info(cls)
    return getattr(info, "guard_fn", None) if info else None


# -- what the frame being compiled changes (cache_compile) ----------------------------------------------

@dataclasses.dataclass(frozen=True)
class SideEffect:
    """One object that existed before the call and that the traced frame changes (Dynamo replays the change after
    its graph runs)."""

    source: str  # the object's source name, as its guards name it
    # attribute -> the Python constant it is left holding, when the change is only attribute stores of constants;
    # None otherwise (a list or dict mutated, a non-constant stored, an attribute deleted)
    stores: dict[str, Any] | None


def dynamo_side_effects() -> list[SideEffect] | None:
    """What the frame Dynamo is compiling changes in Python state that existed before the call (attributes set,
    lists or dicts mutated, cells and globals written); [] for none, None when this torch does not say. Call from
    the backend, while Dynamo's InstructionTranslator is current (2.11-2.15: its thread-local is unset once the frame
    is traced, so a guard hook learns nothing). An object the trace itself created (no source: the step's own
    tensors, a new list) is not existing state: what it becomes is the call's result."""
    try:
        from torch._dynamo.side_effects import AttributeMutationExisting, AttributeMutationNew, ValueMutationNew
        from torch._dynamo.symbolic_convert import InstructionTranslator
        from torch._dynamo.variables import UserDefinedObjectVariable

        side_effects = InstructionTranslator.current_tx().output.side_effects
        modified = [v for v in side_effects.id_to_variable.values() if side_effects.is_modified(v)]
        found = []
        for var in modified:
            source = getattr(var, "source", None)
            # an object the trace made (the step's result, a new list) is not state that existed: where it goes into
            # existing state, that state's own change is reported (a list appended to, an attribute set)
            if source is None or isinstance(var.mutation_type, (AttributeMutationNew, ValueMutationNew)):
                continue
            stored = side_effects.store_attr_mutations.get(var)
            stores: dict[str, Any] | None = None
            # a dict or tuple subclass's own items (2.11: is_underlying_vt_modified; 2.12+: is_base_vt_modified)
            base_modified = (getattr(var, "is_base_vt_modified", None)
                             or getattr(var, "is_underlying_vt_modified", None))
            only_attributes = (isinstance(var.mutation_type, AttributeMutationExisting) and stored
                               and not (isinstance(var, UserDefinedObjectVariable)
                                        and (base_modified is None or base_modified(side_effects))))
            if only_attributes and all(type(a) is str and v.is_python_constant() for a, v in stored.items()):
                stores = {a: v.as_python_constant() for a, v in stored.items()}
            found.append(SideEffect(source_name(source), stores))
    except Exception:  # noqa: BLE001  not inside a compile, or another torch: the guards' own check remains
        return None
    return found
