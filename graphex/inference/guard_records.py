"""Recording, at compile time: each Dynamo guard of a trace becomes a typed record {kind, source, expect, arg},
or makes the entry uncacheable, named (Note [cache_compile keys on what the trace read], graphex/inference/guards.py)."""

from __future__ import annotations

import abc
import builtins
import os
import sys
import types
from typing import Any

import torch

from .guard_sources import NotCheckable, _MISSING, parse_source, resolve
from .fingerprints import _global_state, _is_mutable_class, _saved_tensors_hooks, constant, identity, type_name


# the record layout below; a new kind or field means a new number (2: "class", own-dict "keys"; 3: "abc"; 4: a module's
# parameters, buffers and submodules not shadowed)
GUARD_FORMAT = 4


_STATE_KINDS = {"GLOBAL_STATE": "global_state", "TORCH_FUNCTION_STATE": "torch_function",
                "DEFAULT_DEVICE": "default_device", "AUTOGRAD_SAVED_TENSORS_HOOKS": "saved_tensors_hooks"}
_SKIPPED = {"GRAD_MODE", "DETERMINISTIC_ALGORITHMS", "SHAPE_ENV"}
_IDENTITY = {"ID_MATCH", "BUILTIN_MATCH", "FUNCTION_MATCH", "CLASS_MATCH", "MODULE_MATCH", "NN_MODULE",
             "NONE_MATCH", "BOOL_MATCH"}


def record(entries: list[Any], *, input_sources: set[str], locals_: dict[str, Any],
           globals_: dict[str, Any], global_state: dict[str, Any] | None = None,
           traced_code: list[types.CodeType] | None = None) -> list[dict[str, Any]]:
    """Dynamo's GuardFilterEntry list as typed records (Note [cache_compile keys on what the trace read]).
    `input_sources`: the source names of the graph's inputs (their tensors are checked by the engine);
    `locals_`, `globals_`: the traced frame's, to check that every source reads the object Dynamo saw;
    `global_state`: _global_state() as the call began (Dynamo builds guards with torch functions disabled)."""
    out: list[dict[str, Any]] = []
    seen: set[str] = set()
    for e in entries:  # Note [A global installed by id is found by what it is]
        name = getattr(e.orig_guard, "name", "")
        for root in _BY_ID.findall(name):
            if root not in seen and root in globals_:
                seen.add(root)
                out.append({"kind": "root", "name": root, "expect": identity(globals_[root])})
    out += _global_hooks_empty(globals_)
    reads_environ = False
    for e in entries:
        rec = _record_one(e, input_sources)
        if rec is not None and rec["kind"] == "reads_environ":
            reads_environ = True
            continue
        if rec is not None and rec["kind"] == "global_state" and global_state is not None:
            rec["expect"] = global_state  # the caller's, not the one Dynamo builds guards under
        if rec is not None and "source" in rec and e.has_value:
            # the object the guard saw is the one its own source names (torch 2.11's hasattr guard names `X.attr`
            # and the record checks X: the value is X.attr's)
            path = parse_source(e.orig_guard.name)
            now = resolve(path, locals_, globals_)
            # `dict(x)` is a new copy each time it is read, and so is a code object's `co_varnames` (Python 3.11;
            # torch 2.15 guards what traced code reads of a code object) and a bound method (`X.__iter__`, which
            # torch 2.11's hasattr guard names): equal, not identical
            fresh = path[-1] == ("dict",) or isinstance(now, types.MethodType) or (
                path[-1][0] == "attr" and str(path[-1][1]).startswith("co_")
                and isinstance(resolve(path[:-1], locals_, globals_), types.CodeType))
            if not (now == e.value if fresh else now is e.value):
                raise NotCheckable(f"graphex reads {rec['source']} as another object than Dynamo saw")
        if rec is None:
            continue
        for r in [rec, *(_what_dynamo_leaves_unguarded(rec, e.value) if e.has_value else [])]:
            key = repr(sorted(r.items()))
            if key not in seen:
                seen.add(key)
                out.append(r)
    if reads_environ:
        out.append(_environ_record(traced_code or []))
    return out + _abc_answers(out, locals_, globals_)

# Note [What Dynamo reads without a guard is recorded by graphex]
# Two reads Dynamo makes leave nothing its guards would see change (found adversarially; `torch.compile(backend=
# "eager")` replays the old result as well, torch 2.11 to 2.13):
# - A class compared by identity (`cls.act(x)` with the class passed in, `isinstance(x, K)`, a global class) has no
#   guard on what it holds: `K.act = classmethod(...)`, an attribute assigned to a base class, a method changed in
#   place. graphex checks such a class of Python's as it checks an object's type: by the digest of its contents
#   (a "class" record; Note [A user's class is fingerprinted by its contents], fingerprints.py).
# - An attribute found by a class's Python `__getattr__` (`o.a` where `o.__dict__` has no "a") is traced through that
#   function with no guard that the instance dict still lacks the name: `o.a = 3` later shadows `__getattr__` in
#   eager and not in the replay. graphex records the instance dict's keys of every object whose class has a Python
#   `__getattr__` other than nn.Module's (Dynamo reads a module's `_parameters`, `_buffers`, `_modules` with guards),
#   a Python module excepted (Dynamo reads a module's attributes from its dict; `torch.ops`, a module whose class has
#   a `__getattr__`, adds a key for each op namespace as it loads, so its keys differ between processes). Which names
#   went through `__getattr__` the guards do not say, so any key added or removed is a miss.
#   An nn.Module's parameters, buffers and submodules are found by nn.Module's `__getattr__` the same way:
#   `m.__dict__["s"] = t` (or `object.__setattr__`) shadows buffer `s` in eager. Each such name gets a "not_in_dict"
#   record, the check Dynamo makes for a class attribute (found by a helper).
#   A class a function closes over (`def make(C): def f(x): return C.act(x)`) is read with no guard either: each
#   closure cell of a function the records name (the compiled function, a helper it calls) that holds a class of
#   Python's gets a "class" record too.
def _what_dynamo_leaves_unguarded(rec: dict[str, Any] | None, value: Any) -> list[dict[str, Any]]:
    if rec is None or rec["kind"] not in ("id", "type", "code"):
        return []
    if rec["kind"] in ("id", "code") and type(value) is types.FunctionType:
        return [{"kind": "class", "source": f"{rec['source']}.__closure__[{i}].cell_contents",
                 "expect": class_fingerprint(cell.cell_contents)}
                for i, cell in enumerate(value.__closure__ or ()) if _is_a_mutable_class(cell)]
    if rec["kind"] == "code":
        return []
    if rec["kind"] == "id" and isinstance(value, type) and _is_mutable_class(value):
        return [{"kind": "class", "source": rec["source"], "expect": class_fingerprint(value)}]
    if isinstance(value, torch.nn.Module):
        own = object.__getattribute__(value, "__dict__")
        return [{"kind": "not_in_dict", "source": rec["source"], "arg": name}
                for held in ("_parameters", "_buffers", "_modules") if type(own.get(held)) is dict
                for name in own[held] if isinstance(name, str) and name.isidentifier() and name not in own]
    getattr_ = getattr(type(value), "__getattr__", None)
    if isinstance(value, (type, types.ModuleType)) or type(getattr_) is not types.FunctionType or \
            getattr_ is torch.nn.Module.__getattr__:
        return []  # a module's attributes Dynamo reads from its dict (`torch.ops` fills its own as namespaces load)
    try:
        own = object.__getattribute__(value, "__dict__")
    except AttributeError:
        return []
    if type(own) is not dict:
        raise NotCheckable(f"{rec['source']}'s class has a __getattr__ and its __dict__ is a {type(own).__qualname__}")
    return [{"kind": "keys", "source": f"object.__getattribute__({rec['source']}, '__dict__')",
             "expect": [constant(k) for k in own]}]


# Note [An ABC's answers are recorded]
# `isinstance(x, Base)` with Base an ABC (`collections.abc.Mapping`, transformers' CacheLayerMixin) is answered by
# Base's registry too, and `Base.register(T)` changes the answer without changing any class (found by a helper: the
# old answer was replayed, in the process and in a fresh one that registered at import). Which objects the trace
# asked about the guards do not say, but each is one whose type a record fixes (_FIXES_THE_TYPE); so for each ABC a
# "class" record names, an "abc" record keeps `issubclass(T, Base)` for every such type T (and every class compared
# by identity: `issubclass(K, Base)`). An object whose `__class__` lies about its type is not asked. Checked on load,
# and in the process whenever `abc.get_cache_token()` moved (any registration anywhere bumps it): the watch compares
# that counter (Note [A counter is watched by its value], csrc/python/state_watch.cpp). Asking fills the ABC's own
# caches as an `isinstance` would: a class that later gains a method a `__subclasshook__` looks for keeps its cached
# "no" until the next registration, as it would have after any earlier `isinstance` of the user's.
def _abc_answers(out: list[dict[str, Any]], locals_: dict[str, Any], globals_: dict[str, Any]) -> list[dict[str, Any]]:
    abcs = [r["source"] for r in out
            if r["kind"] == "class" and isinstance(resolve(parse_source(r["source"]), locals_, globals_), abc.ABCMeta)]
    if not abcs:
        return []
    subjects: dict[int, tuple[type, list[str]]] = {}  # each class asked about once, at the first place that fixes it
    for r in out:
        if r["kind"] not in _FIXES_THE_TYPE or "source" not in r:
            continue
        value = resolve(parse_source(r["source"]), locals_, globals_)
        if value is _MISSING:
            continue
        for how in ("type", "self") if isinstance(value, type) and r["kind"] in ("id", "class") else ("type",):
            subject = abc_subject(value, how)
            subjects.setdefault(id(subject), (subject, [r["source"], how]))
    for name in _CALL_STRUCTURE:  # the containers the call itself is made of: its key fixes them
        subjects.setdefault(id(getattr(builtins, name)), (getattr(builtins, name), [f"G['__builtins_dict__']['{name}']",
                                                                                   "self"]))
    records = []
    for source in abcs:
        base = resolve(parse_source(source), locals_, globals_)
        records.append({"kind": "abc", "source": source, "arg": [where for _, where in subjects.values()],
                        "expect": [abc_answer(subject, base) for subject, _ in subjects.values()]})
    return records


# The records that fix the type of what their source reads: `isinstance(x, Base)` asks about that type (found by a
# helper: an int, a list, a dtype, an Enum member guarded by value, with `Base.register(int)` after the trace), and
# about the class itself where a class is compared by identity (`issubclass(K, Base)`)
_FIXES_THE_TYPE = ("type", "equals", "len", "id", "class", "code")
# A list, tuple or dict argument is rebuilt from the call's structure, which the call key holds (no record names it)
_CALL_STRUCTURE = ("list", "tuple", "dict")


def abc_subject(value: Any, how: str) -> type:
    """What an "abc" record asks about at one place: the type of what is there, or ("self") the class that is there."""
    return value if how == "self" else type(value)


def abc_answer(subject: type, base: Any) -> bool | None:
    """`issubclass(subject, base)`, None where that raises (a runtime-checkable Protocol with data members refuses
    issubclass, and isinstance still works: found by a helper)."""
    try:
        return bool(issubclass(subject, base))
    except TypeError:
        return None


def _is_a_mutable_class(cell: types.CellType) -> bool:
    try:
        contents = cell.cell_contents
    except ValueError:  # an empty cell
        return False
    return isinstance(contents, type) and _is_mutable_class(contents)


def class_fingerprint(cls: type) -> list[Any]:
    """A class of Python's compared by identity, by what it holds (a "class" record): its name and contents' digest,
    and its metaclass's when that is Python's too (a class's attribute lookup reads its metaclass's MRO as well:
    `Meta.k`, `Meta.__getattr__`, `Meta.__instancecheck__`; found by a helper)."""
    meta = type(cls)
    return type_name(cls) + ([type_name(meta)] if _is_mutable_class(meta) else [])


# Note [Environment variables are checked by name]
# A trace that reads os.environ (transformers reads TRANSFORMERS_SDPA_FORCE_GQA in every SDPA call)
# gets no guard on the variable from Dynamo, only on the mapping's type. graphex records the value
# (or absence) of every variable whose name is a string constant of the traced code (an
# upper-case identifier, as environment variables are named) and checks them on load and, through
# the watch on os.environ's own dict, whenever the environment changes in the process. A variable
# whose name the code computes is not seen; pass such a decision as an argument.
_ENV_NAME = __import__("re").compile(r"^[A-Z][A-Z0-9_]{2,}$")


def _environ_record(traced_code: list[types.CodeType]) -> dict[str, Any]:
    names: set[str] = set()

    def visit(code: types.CodeType) -> None:
        for k in code.co_consts:
            if isinstance(k, types.CodeType):
                visit(k)
            elif isinstance(k, str) and _ENV_NAME.match(k):
                names.add(k)

    for code in traced_code:
        visit(code)
    return {"kind": "environ", "source": "G['__import_os'].environ._data",
            "expect": {k: os.environ.get(k) for k in sorted(names)}}


_GLOBAL_HOOKS = ("_global_forward_hooks", "_global_forward_pre_hooks", "_global_backward_hooks",
                 "_global_backward_pre_hooks", "_global_forward_hooks_with_kwargs", "_global_forward_hooks_always_called")


def _global_hooks_empty(globals_: dict[str, Any]) -> list[dict[str, Any]]:
    """Records that torch.nn.modules.module's global hook dicts are still empty (register_module_forward_hook
    changes every module's result; Dynamo guards only their type). A trace with a global hook is not cached."""
    import torch.nn.modules.module as module_py

    root = "G['__import_torch_dot_nn_dot_modules_dot_module']"
    out = []
    for name in _GLOBAL_HOOKS:
        hooks = getattr(module_py, name, None)
        if hooks is None:
            continue
        if len(hooks):
            raise NotCheckable(f"a global nn.Module hook is registered (torch.nn.modules.module.{name})")
        out.append({"kind": "len", "source": f"{root}.{name}", "expect": [type_name(type(hooks)), 0]})
    return out


def _record_one(e: Any, input_sources: set[str]) -> dict[str, Any] | None:
    try:
        return _record_guard(e, input_sources)
    except NotCheckable as err:
        name = getattr(e.orig_guard, "name", "")
        if name and name not in str(err):  # say which guard: the source the trace read
            raise NotCheckable(f"{err} ({e.guard_type} guard on {name})") from None
        raise


def _record_guard(e: Any, input_sources: set[str]) -> dict[str, Any] | None:
    kind, guard = e.guard_type, e.orig_guard
    name = guard.name
    if kind in _SKIPPED:
        return None
    if kind in _STATE_KINDS:
        state = _STATE_KINDS[kind]
        if state == "global_state":
            return {"kind": state, "expect": _global_state()}
        if state == "torch_function":
            if torch._C._len_torch_function_stack() != 0:
                raise NotCheckable("the trace ran under a TorchFunctionMode")
            return {"kind": state}
        if state == "default_device":
            device = torch.utils._device.CURRENT_DEVICE
            return {"kind": state, "expect": None if device is None else str(device)}
        if _saved_tensors_hooks() is not None:
            raise NotCheckable("the trace ran under saved-tensors hooks")
        return {"kind": state}
    path = parse_source(name)
    if e.has_value and (e.value is os.environ or e.value is getattr(os.environ, "_data", None)):
        return {"kind": "reads_environ"}  # Note [Environment variables are checked by name]
    if path[0] == ("L", "in_spec") or path == (("L", "flat_args"),):
        return None  # Note [cache_compile keys on what the trace read]: the call's own structure
    keywords = getattr(guard.create_fn, "keywords", None) or {}
    if kind == "HASATTR" and "attr" not in keywords and path[-1][0] == "attr" and len(path) > 1 \
            and name.endswith("." + path[-1][1]):
        # torch 2.11: the guard names the attribute's own source (`X.attr`) and checks hasattr(X, 'attr');
        # since 2.12 it names X and passes attr. Recorded the same way for both.
        attr = _attr_name(path[-1][1], name)
        return {"kind": "hasattr", "source": name[:-len(attr) - 1], "arg": attr, "expect": bool(e.has_value)}
    if not e.has_value:
        raise NotCheckable(f"{kind} guard on {name} has no value")
    value = e.value
    rec: dict[str, Any] = {"kind": "", "source": name}
    if kind in ("TYPE_MATCH", "FAKE_SCRIPT_TYPE_MATCH"):  # the latter: a script object's (a process group's) type
        rec.update(kind="type", expect=type_name(type(value)))
    elif kind in _IDENTITY:
        rec.update(kind="id", expect=identity(value))
    elif kind == "CLOSURE_MATCH":
        if type(value) is types.FunctionType:
            rec.update(kind="code", expect=identity(value.__code__))
        else:
            rec.update(kind="id", expect=identity(value))
    elif kind in ("CONSTANT_MATCH", "EQUALS_MATCH") and isinstance(value, types.CodeType):
        rec.update(kind="id", expect=identity(value))  # a function's __code__ (CLOSURE_MATCH's own guard)
    elif kind in ("CONSTANT_MATCH", "EQUALS_MATCH"):
        rec.update(kind="equals", expect=constant(value))
    elif kind in ("SEQUENCE_LENGTH", "EMPTY_NN_MODULE_HOOKS_DICT", "LIST_LENGTH"):
        rec.update(kind="len", expect=[type_name(type(value)), len(value)])
    elif kind == "NOT_NONE_MATCH":
        rec.update(kind="not_none")
    elif kind == "NOT_PRESENT_IN_GENERIC_DICT":
        rec.update(kind="not_in_dict", arg=_attr_name(keywords.get("attr"), name))
    elif kind == "HASATTR":
        attr = _attr_name(keywords.get("attr"), name)
        rec.update(kind="hasattr", arg=attr, expect=hasattr(value, attr))
    elif kind in ("DICT_CONTAINS", "DICT_NOT_CONTAINS"):
        # torch 2.11 has no DICT_NOT_CONTAINS: DICT_CONTAINS(key, invert=True) checks the key is absent
        rec.update(kind="contains", arg=constant(keywords.get("key")),
                   expect=(kind == "DICT_CONTAINS") != bool(keywords.get("invert", False)))
    elif kind in ("DICT_KEYS_MATCH", "MAPPING_KEYS_CHECK", "DICT_KEYS"):
        rec.update(kind="keys", expect=[constant(k) for k in value.keys()])
    elif kind == "DUPLICATE_INPUT":
        other = keywords.get("source_b")
        rec.update(kind="same", arg=getattr(other, "name", other))
        parse_source(rec["arg"])
    elif kind == "OPAQUE_OBJ_GUARD_FN_MATCH":
        from .. import compat

        fn = compat.opaque_guard_fn(type(value))
        if fn is None:
            return None  # Dynamo adds no check either
        rec.update(kind="opaque", expect=constant(fn(value)))
    elif kind == "TENSOR_MATCH":
        if name in input_sources:  # the engine checks dtype, shape, strides, device; the Python type is ours
            rec.update(kind="type", expect=type_name(type(value)))
            return rec
        if not isinstance(value, torch.Tensor):
            raise NotCheckable(f"TENSOR_MATCH guard on {name} holds a {type(value).__qualname__}")
        rec.update(kind="tensor", expect=_tensor_meta(value))
    else:
        raise NotCheckable(f"Dynamo's {kind} guard on {name}")
    return rec

# Note [A global installed by id is found by what it is]
# Dynamo puts some objects the trace uses into the traced frame's globals under a name made of
# their id and the compile's number (`G['_140473466358656_c6']`), which no other process has.
# Such a root is recorded by what the object is (a module, class or function by qualified name,
# identity() above) and found again by that name in sys.modules when an entry is loaded.
_BY_ID = __import__("re").compile(r"G\['(_\d+_c\d+)'\]")


def _find_by_identity(fingerprint: Any) -> Any:
    """The live object an identity() fingerprint names, or _MISSING (modules must already be imported)."""
    kind = fingerprint[0]
    if kind == "module":
        return sys.modules.get(fingerprint[1], _MISSING)
    if kind == "global":  # Note [A sentinel is the module global that holds it]
        mod = sys.modules.get(fingerprint[1])
        found = getattr(mod, "__dict__", {}) if isinstance(mod, types.ModuleType) else {}
        return found.get(fingerprint[2], _MISSING) if isinstance(found, dict) else _MISSING
    if kind in ("class", "function", "enum"):
        obj: Any = sys.modules.get(fingerprint[1], _MISSING)
        for part in fingerprint[2].split("."):
            obj = getattr(obj, part, _MISSING) if obj is not _MISSING else _MISSING
        if kind == "enum" and obj is not _MISSING:
            obj = getattr(obj, fingerprint[3], _MISSING)
        if obj is not _MISSING:
            try:
                if identity(obj) != fingerprint:
                    return _MISSING
            except NotCheckable:
                return _MISSING
        return obj
    return _MISSING


def _attr_name(attr: Any, where: str) -> str:
    if not isinstance(attr, str) or not attr.isidentifier():
        raise NotCheckable(f"a guard on {where} names attribute {attr!r}")
    return attr


def _tensor_meta(t: torch.Tensor) -> list[Any]:
    return [type_name(type(t)), str(t.dtype), str(t.device), list(t.shape), list(t.stride()), t.requires_grad]
