"""One guard record's check, as the generated guard function writes it (guards.py, GuardSet): the condition for a
record of each kind (`_condition`), and the global torch state's checks in their full and fast forms. Everything a
condition compares with is held in the function's `H` tuple (`_hold`), never written into its source."""

from __future__ import annotations

import abc
import os
import types
from typing import Any, Callable

import torch
import torch.utils._device  # read by the default-device guard; imported by Dynamo, which a cache hit never imports

from .guard_sources import NotCheckable, Path, _MISSING, parse_source, resolve
from .fingerprints import _global_state, _saved_tensors_hooks, float_key, from_constant, identity, type_name
from .guard_records import _attr_name, _find_by_identity, _tensor_meta, abc_answer, abc_subject, class_fingerprint
from .state_watch import _ClassUnchanged


def _hold(held: list[Any], obj: Any) -> str:
    held.append(obj)
    return f"H[{len(held) - 1}]"


def _condition(rec: dict[str, Any], value: Any, v: str, held: list[Any], locals_: dict[str, Any],
               globals_: dict[str, Any], var: Callable[[Path], str]) -> tuple[str, str | None]:
    kind, expect = rec["kind"], rec.get("expect")
    if kind == "type":
        now = type_name(type(value))
        if now != expect:
            if now[:2] == expect[:2]:
                return "", f"built for another version of class {'.'.join(expect[:2])} (its methods or class " \
                           "attributes differ: Note [A user's class is fingerprinted by its contents])"
            return "", f"built for a {'.'.join(expect[:2])}, now a {'.'.join(now[:2])}"
        cond = f"type({v}) is {_hold(held, type(value))}"
        if len(expect) > 2:  # Note [A user's class is fingerprinted by its contents]: also within a process
            cond += f" and {_hold(held, _ClassUnchanged(type(value), expect[2]))}()"
        return cond, None
    if kind == "id":
        try:  # a sentinel: the very object its module global holds here (Note [A sentinel is the module global ...])
            now = expect if expect[0] == "global" and _find_by_identity(expect) is value else identity(value)
        except NotCheckable:
            now = ["object", type(value).__qualname__]
        if now != expect:
            return "", f"built for {_show(expect)}, now {_show(now)}"
        return f"{v} is {_hold(held, value)}", None
    if kind == "class":  # Note [What Dynamo reads without a guard is recorded by graphex]
        if not isinstance(value, type) or class_fingerprint(value) != expect:
            return "", f"class {'.'.join(expect[:2])} holds other methods or class attributes now (Note [A user's " \
                       "class is fingerprinted by its contents])"
        cond = f"{_hold(held, _ClassUnchanged(value, expect[2]))}()"
        if len(expect) > 3:  # its metaclass: the same one (`cls.__class__ = Meta2`), with the same contents
            meta = type(value)
            cond += f" and type({v}) is {_hold(held, meta)} and {_hold(held, _ClassUnchanged(meta, expect[3][2]))}()"
        return cond, None
    if kind == "abc":  # Note [An ABC's answers are recorded] (guard_records.py)
        found = [resolve(parse_source(s), locals_, globals_) for s, _ in rec["arg"]]
        if not isinstance(value, abc.ABCMeta) or any(f is _MISSING for f in found):
            return "", "is no ABC now, or an object it was asked about is gone"
        types_ = [abc_subject(f, how) for f, (_, how) in zip(found, rec["arg"])]
        answers = [abc_answer(t, value) for t in types_]
        if answers != list(expect):
            changed = [t.__qualname__ for t, a, e in zip(types_, answers, expect) if a != e]
            return "", f"{', '.join(changed)} {'is' if len(changed) == 1 else 'are'} a {value.__qualname__} now " \
                       f"or no longer (registered with the ABC: Note [An ABC's answers are recorded])"
        return f"{_hold(held, _AbcAnswers(value, types_, answers))}()", None
    if kind == "code":
        code = getattr(value, "__code__", None)
        if not isinstance(code, types.CodeType) or identity(code) != expect:
            return "", "the function is another one (its code differs)"
        return f"{v}.__code__ is {_hold(held, code)}", None
    if kind == "equals":
        c = from_constant(expect)
        if type(value) is not type(c) or not _equal(value, c):
            return "", f"built with {c!r}, now {value!r}"
        if type(c) is float:  # by bits: -0.0 != 0.0 and NaN == NaN here, as the trace's constant would differ
            if c != c:  # a NaN: by its bits (float.hex() is 'nan' for every NaN)
                return f"type({v}) is float and {_hold(held, float_key)}({v}) == {float_key(c)!r}", None
            return f"type({v}) is float and {v}.hex() == {c.hex()!r}", None
        return f"type({v}) is {_hold(held, type(c))} and {v} == {_hold(held, c)}", None
    if kind == "len":
        tname, n = expect
        if type_name(type(value)) != tname or len(value) != n:
            return "", f"built with {n} items, now {len(value)}"
        return f"type({v}) is {_hold(held, type(value))} and len({v}) == {int(n)!r}", None
    if kind == "not_none":
        return (f"{v} is not None", None) if value is not None else ("", "is None")
    if kind == "not_in_dict":
        attr = _attr_name(rec["arg"], rec["source"])
        if attr in getattr(value, "__dict__", {}):
            return "", f"has its own attribute {attr!r} now"
        return f"{attr!r} not in {v}.__dict__", None
    if kind == "hasattr":
        attr = _attr_name(rec["arg"], rec["source"])
        if hasattr(value, attr) is not bool(expect):
            return "", f"hasattr {attr!r} is {not expect} now"
        return f"hasattr({v}, {attr!r}) is {bool(expect)!r}", None
    if kind == "contains":
        key = from_constant(rec["arg"])
        if (key in value) is not bool(expect):
            return "", f"{key!r} {'is no longer' if expect else 'is now'} a key"
        return f"({_hold(held, key)} in {v}) is {bool(expect)!r}", None
    if kind == "keys":  # in the mapping's own order (an OrderedDict's move_to_end leaves dict order alone)
        keys_now = list(value.keys())
        if keys_now != [from_constant(k) for k in expect]:
            return "", f"its keys changed ({keys_now!r})"
        return f"list({v}.keys()) == {_hold(held, keys_now)}", None
    if kind == "same":
        other = parse_source(rec["arg"])
        if resolve(other, locals_, globals_) is not value:
            return "", f"is no longer the same object as {rec['arg']}"
        return f"{v} is {var(other)}", None
    if kind == "environ":  # Note [Environment variables are checked by name]
        want = {str(k): (None if v is None else str(v)) for k, v in dict(expect).items()}
        now = {k: os.environ.get(k) for k in want}
        if now != want:
            changed = sorted(k for k in want if now[k] != want[k])
            return "", f"environment variable {', '.join(changed)} is {now[changed[0]]!r}, built with {want[changed[0]]!r}"
        return f"{_hold(held, _environ_is(want))}()", None
    if kind == "opaque":
        from .. import compat

        fn = compat.opaque_guard_fn(type(value))
        want = from_constant(expect)
        if fn is None or fn(value) != want:
            return "", f"the {type(value).__qualname__}'s guarded values changed"
        return f"{_hold(held, fn)}({v}) == {_hold(held, want)}", None
    if kind == "tensor":
        if not isinstance(value, torch.Tensor) or _tensor_meta(value) != expect:
            return "", "the tensor's type, dtype, device, shape, strides or requires_grad changed"
        return f"{_hold(held, _tensor_is(expect))}({v})", None
    raise NotCheckable(f"a guard record of kind {kind!r}")


class _AbcAnswers:
    """Note [An ABC's answers are recorded]: `issubclass(t, cls)` still gives `answers`; asked again only when a class
    was registered with some ABC since (the ABCs' own caches are emptied by the same counter)."""

    def __init__(self, cls: Any, types_: list[type], answers: list[bool]) -> None:
        self.cls, self.types, self.answers, self.token = cls, types_, answers, abc.get_cache_token()

    def __call__(self) -> bool:
        token = abc.get_cache_token()
        if token == self.token:
            return True
        if [abc_answer(t, self.cls) for t in self.types] != self.answers:
            return False
        self.token = token
        return True


def _environ_is(want: dict[str, Any]) -> Callable[[], bool]:
    def check() -> bool:
        return all(os.environ.get(k) == v for k, v in want.items())

    return check


def _tensor_is(expect: list[Any]) -> Callable[[Any], bool]:
    def check(t: Any) -> bool:
        return isinstance(t, torch.Tensor) and _tensor_meta(t) == expect

    return check


def _equal(a: Any, b: Any) -> bool:
    if type(a) is float:
        return float_key(a) == float_key(b) if type(b) is float else False  # -0.0 is not 0.0, a NaN is its bits
    try:
        return bool(a == b)
    except Exception:  # noqa: BLE001
        return False


def _show(fingerprint: Any) -> str:
    return ".".join(str(p) for p in fingerprint[1:3]) if isinstance(fingerprint, list) else repr(fingerprint)


def _state_holds(kind: str, expect: Any) -> bool:
    if kind == "global_state":
        return _global_state() == expect
    if kind == "torch_function":
        return torch._C._len_torch_function_stack() == 0
    if kind == "default_device":
        device = torch.utils._device.CURRENT_DEVICE
        return (None if device is None else str(device)) == expect
    return _saved_tensors_hooks() is None


def _global_state_checker(expect: Any) -> "_ThreadsAware":
    """The one GlobalStateGuard of a global_state record, for both forms of its check: the full form's
    _ThreadsAware re-arms the very guard the fast form (and the C++ FastCall) checks, so after
    torch.set_num_threads the fast path holds again (found by a helper: it re-armed a guard of its own, and the
    fast path never answered again)."""
    import json

    guard = torch._C._dynamo.guards.GlobalStateGuard()
    state = dict(expect, num_threads=torch.get_num_threads())
    guard.__setstate__(json.dumps(state, separators=(",", ":")))
    return _ThreadsAware(guard, state)


def _state_check(kind: str, expect: Any, held: list[Any], fast: bool = False,
                 checker: "_ThreadsAware | None" = None) -> str:
    """The check of one global-state record. `fast`: the fast path's form (Note [One function checks the guards
    and binds the inputs]): C++ calls and attribute reads only; when it fails, the full path decides. `checker`:
    a global_state record's _global_state_checker, shared by both forms."""
    if kind == "global_state":
        assert checker is not None
        return f"{_hold(held, checker.guard)}.check()" if fast else f"{_hold(held, checker)}()"
    if kind == "torch_function":
        return f"{_hold(held, torch._C._len_torch_function_stack)}() == 0"
    if kind == "default_device":
        if fast and expect is None:
            return f"{_hold(held, torch.utils._device)}.CURRENT_DEVICE is None"
        return f"{_hold(held, _default_device_is(expect))}()"
    if fast:
        return f"{_hold(held, torch._C._autograd._top_saved_tensors_default_hooks)}(True) is None"
    return f"{_hold(held, _saved_tensors_hooks)}() is None"


class _ThreadsAware:
    """GlobalStateGuard.check with the thread count of this process (Note [cache_compile keys on what the
    trace read]): re-armed when torch.set_num_threads changes it."""

    def __init__(self, guard: Any, state: dict[str, Any]) -> None:
        self.guard, self.state, self.threads = guard, state, state["num_threads"]

    def __call__(self) -> bool:
        if self.guard.check():
            return True
        threads = torch.get_num_threads()
        if threads == self.threads:
            return False
        import json

        self.threads = self.state["num_threads"] = threads
        self.guard.__setstate__(json.dumps(self.state, separators=(",", ":")))
        return self.guard.check()


def _default_device_is(expect: Any) -> Callable[[], bool]:
    def check() -> bool:
        device = torch.utils._device.CURRENT_DEVICE
        return (None if device is None else str(device)) == expect

    return check
