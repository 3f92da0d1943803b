"""What a cache entry's trace read, as Dynamo guarded it: recorded at compile, checked before every replay.

This file checks (GuardSet: bind, then the generated check-and-bind function). The rest, one job per file:
guard_sources.py (a guard's source as a typed path, parsed and resolved), guard_checks.py (one record's check as
generated code, the global torch state's checks), fingerprints.py (what a value is, portably), guard_records.py
(Dynamo's guards as typed records, at compile), pins.py (which guards a watched dict proves).

Note [cache_compile keys on what the trace read]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
Dynamo records every piece of Python state a trace depended on as a guard: a module attribute
read (`self.scale == 2.0`), a config object's field, a dict's value, the function stored on a
module (`self.fn is torch.tanh`), a global, the type of every object walked through, the
hooks dicts of every submodule, the global torch state. Keying the cache on a list of things
we thought of missed each one we did not (three rounds of stale results); Dynamo's list is
what the trace actually read. So:

  * at compile (capture.py), a `guard_filter_fn` (torch.compile's public option) sees every
    guard with its source (an access path such as `L['func'].__self__.cfg.mult`) and the value
    found there; `guard_records.record` turns each into a typed record {kind, source, expect, arg}, with the
    value fingerprinted portably (constants by value, types, modules, classes and functions by
    qualified name, functions also by their code). A guard that cannot be checked from another
    process (an object by identity, a weak reference, a dict version, an unknown guard type)
    makes the entry uncacheable, logged with the guard; the call still runs compiled.
  * at load (cache_compile.py), `GuardSet.bind` resolves every source again in this process
    and compares fingerprints: a mismatch is a miss naming the guard, never a stale hit. What
    it found (the type, the module, the function's code object) is then held, and one check
    function is generated from the typed records, run before every replay: identity and type
    by `is`, constants by type and value, lengths, hooks dicts empty, the global state through
    torch's own GlobalStateGuard. A change after the first call (`m.scale = 3.0`,
    `m.proj = nn.Linear(...)`, `m.fn = torch.relu`) fails it, and the call recompiles.

A source is parsed with `ast` and interpreted from a small grammar (a root `L[...]` or `G[...]`,
attributes, constant subscripts, `type(x)`, `list(dict.keys(x))[i]`); the check function is
generated from the parsed records only: names checked as identifiers, constants written with
`repr` of ints and strings. Nothing read from a cache file is evaluated as it is.

Left out, with their reasons: guards on `L['in_spec']` (the call's argument structure: the
entry is found by exactly that structure, so they hold by construction); TENSOR_MATCH on a
graph input (the engine checks dtype, shape, stride and device of every input on every call,
Note [Entries are found by signature, not by exceptions]); GRAD_MODE and
DETERMINISTIC_ALGORITHMS (part of GLOBAL_STATE); SHAPE_ENV (Note [A dynamic entry carries its
shape guards]); the thread count in GLOBAL_STATE (it changes inductor's code, not the ATen
program graphex replays).
"""

from __future__ import annotations

import re
import types
from typing import Any, Callable

import torch

from ..program import HELD_KINDS, Binding
from .guard_sources import NotCheckable, Path, _KEYED_BY_PATH, _MISSING, _STEPS, contextvar_get, parse_source, resolve, resolve_global
from .fingerprints import from_constant, one_check
from .guard_records import _find_by_identity
from .guard_checks import _condition, _global_state_checker, _hold, _show, _state_check, _state_holds
from .pins import _Pins, is_argument
from .state_watch import SameMembers, _ClassUnchanged


# What a FastCall compares a flattened argument by, besides its exact type: the value, as the call key has it (a
# float by its bits). A dtype, a device, bytes are compared by the residual's guards (found by a helper: compared by
# type alone, a new dtype replayed the old one's entry). One definition: loaded.py builds the FastCall from it.
FAST_CALL_VALUE_TYPES = (int, float, bool, str, type(None))


class GuardSet:
    """The records of one entry. `bind` checks them in this process and builds `run`, called before each
    replay: `run(flat_args, func)` is the held inputs (Note [One binder]) when every guard holds, else None.

    Note [One function checks the guards and binds the inputs]
    The generated function checks the guards, then reads what only Python can read of the program's
    inputs, the held ones: parameters, buffers and tensors an argument holds, through the source
    Dynamo read them from (`L['func'].__self__._modules['proj']._parameters['weight']`), so a
    submodule or parameter replaced after the first call is the one used. The arguments, their
    sizes and strides, the shape guards and the result leaves are C++'s, the one binder every
    runner of a program's bytes uses (Note [One binder], csrc/runtime/binder.h). It has two paths:
      * full: every guard, every path read anew (common prefixes once per call);
      * fast, taken while a StateWatch (Note [A watched dict proves its guards still hold],
        csrc/python/state_watch.cpp) says that no dict the pinned guards read through has
        changed and no watched object changed its type: only the "always" guards (those that
        read through something no dict version covers), and the parameters the full path read
        last time.
    Each full check takes a fresh watch's snapshot before it reads anything and publishes the pair
    (watch, parameters) only when it passes, so a change made at any moment, on any thread, is seen
    by the next call.
    """

    def __init__(self, records: list[dict[str, Any]]) -> None:
        self.records = records
        self.run: Callable[[Any, Any], list[Any] | None] | None = None
        self.source = ""
        self.count = len(records)
        self.always = 0  # records checked on every call (the rest: while the watch holds, by the watch)
        self._published: list[Any] = [(None, [])]
        self._stale: list[bool] = [False]
        # Note [A plain call's fast path is one C++ call] (csrc/python/cached_call.cpp): what the fast path proves besides
        # the watch, as C++ checks it: {"args": {i: the class StateWatch or None}, "state": {kind: object},
        # "residual": the generated `rest(flat_args, func, S)`, the fast path's other checks (a property's hasattr, a
        # config's computed attribute, what an argument holds) and its held inputs (S: the published ones, and the
        # tensors an argument holds), or None when there are no such checks and S is every held input}.
        self.native: dict[str, Any] | None = None
        self.fast_parts: tuple[dict[str, Any], list[Any]] | None = None  # (native, P) of the last bind

    @property
    def watch(self) -> Any:
        """The StateWatch of the last full check (tests, tools)."""
        return self._published[0][0]

    @property
    def needs_rebind(self) -> bool:
        """Note [A watch is of the objects it was built from]: a full check passed on other objects than bind found
        (`m.cfg = Config()` equal to the old one): the watch watches the old ones, so nothing is published and the
        fast path stays off until `bind` runs again on the objects there now."""
        return self._stale[0]

    def bind(self, locals_: dict[str, Any], globals_: dict[str, Any],
             inputs: list[Binding] | None = None, *, watch_arguments: bool = True) -> str | None:
        """None when every record holds now (and `run` is built), else which guard fails and how."""
        with one_check():  # Note [One check reads each class body once]
            return self._bind(locals_, globals_, inputs, watch_arguments)

    def _bind(self, locals_: dict[str, Any], globals_: dict[str, Any], inputs: list[Binding] | None,
              watch_arguments: bool) -> str | None:
        held: list[Any] = []  # objects the generated code compares with
        pins = _Pins(watch_arguments)
        full = _Emitter(held, pins, globals_)
        fast = _Emitter(held, pins, globals_)
        fast.on_fail = "return slow(flat_args, func)"  # the fast path proves; it never refuses
        rest = _Emitter(held, pins, globals_)  # the fast path's checks C++ does not make (GuardSet.native's residual)
        rest.on_fail = "return None"
        always = 0
        native: dict[str, Any] = {"args": {}, "state": {}}
        try:
            for rec in self.records:
                kind = rec["kind"]
                if kind == "root":  # Note [A global installed by id is found by what it is]
                    obj = _find_by_identity(rec["expect"])
                    if obj is _MISSING:
                        return f"{_show(rec['expect'])} (a global the trace used) is not loaded in this process"
                    globals_ = full.globals_ = fast.globals_ = {**globals_, rec["name"]: obj}
                    continue
                if kind in ("global_state", "torch_function", "default_device", "saved_tensors_hooks"):
                    if not _state_holds(kind, rec.get("expect")):
                        return f"the global torch state differs ({kind})"
                    checker = _global_state_checker(rec["expect"]) if kind == "global_state" else None
                    full.check(_state_check(kind, rec.get("expect"), held, checker=checker))
                    fast.check(_state_check(kind, rec.get("expect"), held, fast=True, checker=checker))
                    always += 1
                    # C++ calls what the fast form calls (held[-1]); another default device: the residual's check
                    if kind in native["state"] or (kind == "default_device" and rec.get("expect") is not None):
                        rest.check(_state_check(kind, rec.get("expect"), held, fast=True, checker=checker))
                    else:
                        native["state"][kind] = held[-1]
                    continue
                path = parse_source(rec["source"])
                value = resolve(path, locals_, globals_)
                if value is _MISSING:
                    return f"{rec['source']} does not exist"
                cond, why = _condition(rec, value, full.var(path), held, locals_, globals_, full.var)
                if why is not None:
                    return f"{rec['source']}: {why}"
                full.check(cond)
                if not pins.covers(rec, path, value, locals_, globals_):
                    fast.check(_condition(rec, value, fast.var(path), held, locals_, globals_, fast.var)[0])
                    always += 1
                    if not _native_arg_check(native, rec, path, held):
                        rest.check(_condition(rec, value, rest.var(path), held, locals_, globals_, rest.var)[0])
            reads_full, reads_fast, reads_rest, static = [], [], [], []
            for b in inputs or []:
                if b.kind not in HELD_KINDS:
                    self._check_binding(b)
                    continue  # bound in C++ from the arguments (Note [One binder])
                reads_full.append(self._input(b, locals_, globals_, full.var))
                if pins.pinned(parse_source(b.source), locals_, globals_):  # a tensor at a watched path: fixed
                    reads_fast.append(f"S[{len(static)}]")
                    reads_rest.append(f"S[{len(static)}]")
                    static.append(len(reads_full) - 1)
                else:
                    reads_fast.append(self._input(b, locals_, globals_, fast.var))
                    reads_rest.append(self._input(b, locals_, globals_, rest.var))
        except _Fails as e:
            return str(e)
        except Exception as e:  # noqa: BLE001  a record graphex did not write (a forged or damaged entry)
            return f"an unusable guard record ({type(e).__name__}: {e})"
        from .. import _C

        # Note [A watch is of the objects it was built from]: the full check also asks whether each pinned path still
        # leads to the object bind found there
        # Note [An object passed in is watched while the same one is passed]: the fast path and the residual take the
        # watch's word for what an argument holds only while the argument is the object the watch watches
        for path, obj in pins.anchors.items():
            if is_argument(path):  # the argument itself; what it holds, the watch proves
                fast.check(f"{fast.var(path)} is {_hold(held, obj)}")
                rest.check(f"{rest.var(path)} is {_hold(held, obj)}")
        # Note [A transformers config's attribute is read as object's]: the premises of the watch this check publishes
        for at, premise in pins.premises.items():
            full.check(f"{_hold(held, premise)}({full.var(at)})")
        full.lines.append("fresh = True")
        for path, obj in pins.anchors.items():
            full.lines.append(f"if {full.var(path)} is not {_hold(held, obj)}: fresh = False")
        if pins.classes:  # Note [A class is watched by everything its digest reads] (state_watch.py)
            full.lines.append(f"if not {_hold(held, SameMembers(pins.classes))}(): fresh = False")
        watched = (list(pins.dicts.values()), list(pins.objects.values()), list(pins.functions.values()),
                   list(pins.owners.values()), list(pins.slots.values()), list(pins.lists.values()),
                   list(pins.counters.values()))
        watch = _C.StateWatch(*watched)  # never snapshotted: the first call takes the full path
        # Note [One function checks the guards and binds the inputs]: P[0] is (watch, parameters) published as
        # one tuple after a full check that ran after the watch's snapshot, so a call on another thread sees
        # either the old pair (whose watch no longer holds after a change) or the new one, never a mix.
        source = (
            "def full(flat_args, func):\n  try:\n" + full.body() +
            f"\n    return [{', '.join(reads_full)}], fresh\n  except Exception:\n    return None\n\n"
            "def run(flat_args, func):\n"
            "  W, S = P[0]\n"
            "  if W.unchanged():\n    try:\n" + fast.body(indent=6) +
            f"\n      return [{', '.join(reads_fast)}]\n    except Exception:\n      pass\n"
            "  return slow(flat_args, func)\n\n"
            "def slow(flat_args, func):\n"
            "  w = new_watch(*watched)\n"
            "  w.snapshot()\n"
            "  r = full(flat_args, func)\n"
            "  if r is None:\n    return None\n"
            "  r, fresh = r\n"
            "  if not fresh:\n"
            "    P[0] = (DEAD, [])\n"
            "    STALE[0] = True\n"
            "    return r\n"
            f"  P[0] = (w, [r[i] for i in {tuple(static)!r}])\n"
            "  return r\n")
        if rest.lines or len(static) != len(reads_full):
            source += ("\ndef rest(flat_args, func, S):\n  try:\n" + rest.body() +
                       f"\n    return [{', '.join(reads_rest)}]\n  except Exception:\n    return None\n")
        namespace: dict[str, Any] = {"H": tuple(held), "P": [(watch, [])], "new_watch": _C.StateWatch,
                                     "watched": watched, "DEAD": _C.StateWatch([], []), "STALE": [False],
                                     "__builtins__": {"type": type, "len": len, "list": list, "dict": dict, "object": object,
                                                      "hasattr": hasattr, "float": float, "Exception": Exception,
                                                      "cv_get": contextvar_get}}
        exec(compile(source, "<graphex guards>", "exec"), namespace)  # generated from typed records only
        self._published, self._stale = namespace["P"], namespace["STALE"]
        self.run, self.source, self.always = namespace["run"], source, always
        native["residual"] = namespace.get("rest")
        self.native = native
        # one object: a FastCall made on another thread while this bind runs gets the residual and the published pair
        # of one bind, never one of each (the residual's S indices are its own bind's)
        self.fast_parts = (native, namespace["P"])
        return None

    @staticmethod
    def _check_binding(binding: Binding) -> None:
        """A binding C++ resolves from the arguments (Note [One binder]): one it knows."""
        if binding.kind not in ("arg", "size", "stride", "storage_offset"):
            raise NotCheckable(f"an input binding of kind {binding.kind!r}")

    @staticmethod
    def _input(binding: Binding, locals_: dict[str, Any], globals_: dict[str, Any],
               var: Callable[[Path], str]) -> str:
        """The expression that reads one held input (Note [A program input is bound by one typed Binding]): a
        parameter, buffer or tensor an argument holds, through the source Dynamo read it from."""
        kind = binding.kind
        if kind in HELD_KINDS and binding.source:  # attr: Note [A tensor an argument holds ...]
            path = parse_source(binding.source)
            if not isinstance(resolve(path, locals_, globals_), torch.Tensor):
                raise _Fails(f"the {kind} read from {binding.source} is gone")
            return var(path)
        raise NotCheckable(f"an input binding of kind {kind!r}")


def _native_arg_check(native: dict[str, Any], rec: dict[str, Any], path: Path, held: list[Any]) -> bool:
    """Whether C++ checks one more record the fast path checks on every call (then `native` has it); if not, the
    FastCall's residual function checks it. C++ checks a flattened argument's exact type and, for a number or str,
    its value as the call key has it (a float by its bits), so: the type of an argument (`type(flat_args[i]) is T`,
    and its class unchanged: the _ClassUnchanged just held), and an argument equal to a number or str (which the
    value the FastCall records at a hit equals)."""
    if not is_argument(path) or type(path[1][1]) is not int:
        return False
    if rec["kind"] == "equals":  # C++ compares these by value; any other constant (a dtype, a device): the residual's
        return type(from_constant(rec["expect"])) in FAST_CALL_VALUE_TYPES
    if rec["kind"] != "type" or path[1][1] in native["args"]:
        return False
    native["args"][path[1][1]] = held[-1].watch if isinstance(held[-1], _ClassUnchanged) else None
    return True


class _Emitter:
    """Straight-line code for one path of the generated function: each path prefix read once, then checks."""

    def __init__(self, held: list[Any], pins: "_Pins", globals_: dict[str, Any]) -> None:
        self.held, self.pins, self.globals_ = held, pins, globals_
        self.lines: list[str] = []
        self.names: dict[Path, str] = {}
        self.on_fail = "return None"
        self.mappingproxy: str | None = None  # H[i] holding types.MappingProxyType, once read

    def check(self, cond: str) -> None:
        self.lines.append(f"if not ({cond}): {self.on_fail}")

    def body(self, indent: int = 4) -> str:
        lines = _without_implied(self.lines, self.held)
        return "\n".join(" " * indent + ln for ln in lines) if lines else " " * indent + "pass"

    def var(self, path: Path) -> str:
        if path in self.names:
            return self.names[path]
        if len(path) == 1:
            kind, name = path[0]
            if kind == "L":
                if name not in ("flat_args", "func"):
                    raise NotCheckable(f"local {name!r}")
                expr = name
            else:
                obj = resolve_global(name, self.globals_)
                if obj is _MISSING:
                    raise _Fails(f"global {name} is not defined in this process")
                expr = _hold(self.held, obj)
        elif path[-1][0] == "item" and path[-2] == ("dict",):  # Note [A class dict's item is read without a copy]
            if self.mappingproxy is None:  # held once per function
                self.mappingproxy = _hold(self.held, types.MappingProxyType)
            proxy, mp = self.var(path[:-2]), self.mappingproxy
            key = path[-1][1]
            expr = f"({proxy}[{key!r}] if type({proxy}) is {mp} else dict({proxy})[{key!r}])"
        else:
            base = self.var(path[:-1])
            step = path[-1]
            arg = step[1] if len(step) > 1 else None
            if step[0] in _KEYED_BY_PATH:
                arg = self.var(arg)
            elif step[0] == "key":
                arg = int(arg)
            expr = _STEPS[step[0]][1].format(b=base, a=arg)
        v = f"v{len(self.names)}"
        self.lines.append(f"{v} = {expr}")
        self.names[path] = v
        return v


class _Fails(Exception):
    pass


# Note [A class dict's item is read without a copy]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# Dynamo reads a class attribute as `dict(type(x).__dict__)['name']`: a copy of the class's whole dict (35 entries on
# transformers' Cache), made on every call by the generated code, to read one item. A mappingproxy's item is its
# dict's item, so where the object is exactly a mappingproxy (what `type.__dict__` gives) the item is read from it;
# anything else (a metaclass's own `__dict__`) is copied as before. Other reads of the copy (its keys by position,
# `dict.__getitem__`) still take the copy.

# Note [A check another line implies is not emitted]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# Dynamo records `hasattr(x, 'a')` and, when the trace read it, `x.a`'s type and value; and a type match next to an
# equality that tests the same type first. Every way a generated function can fail answers the same (a false check
# and an exception alike return None, or go to the full check), so a check that another line of the same function
# implies is dropped from it, wherever it stands: `hasattr(vX, 'a') is True` where the function reads `vX.a` (the read
# raises where hasattr says False, hasattr raises where the read does), and `type(vX) is T` where another check
# begins `type(vX) is T and`. Each is one Python call fewer per cache_compile call: transformers' configs answer
# `hasattr` through their own Python `__getattribute__`.
_READ = re.compile(r"(v\d+) = (v\d+)\.([A-Za-z_]\w*)$")
_HASATTR_TRUE = re.compile(r"if not \(hasattr\((v\d+), '([A-Za-z_]\w*)'\) is True\): ")
_TYPE_ONLY = re.compile(r"if not \(type\((v\d+)\) is H\[(\d+)\]\): ")
_TYPE_AND = re.compile(r"if not \(type\((v\d+)\) is H\[(\d+)\] and ")


def _without_implied(lines: list[str], held: list[Any]) -> list[str]:
    """`lines` less the checks another line implies (Note [A check another line implies is not emitted])."""
    reads = {(m[2], m[3]) for m in map(_READ.match, lines) if m}
    typed = {(m[1], id(held[int(m[2])])) for m in map(_TYPE_AND.match, lines) if m}

    def implied(line: str) -> bool:  # each pattern ends at its condition's close: the whole condition
        if m := _HASATTR_TRUE.match(line):
            return (m[1], m[2]) in reads
        if m := _TYPE_ONLY.match(line):
            return (m[1], id(held[int(m[2])])) in typed
        return False

    return [ln for ln in lines if not implied(ln)]
