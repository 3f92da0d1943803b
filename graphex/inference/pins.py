"""Which guards a watched dict proves still hold (Note [A watched dict proves its guards still hold]): the paths
pinned by dicts that cannot change unseen, and the objects, classes and slots those reads go through (what watching
a class reads: state_watch.py)."""

from __future__ import annotations

import abc
import collections
import enum
import types
from typing import Any

import torch

from . import lookups
from .guard_sources import Path, parse_source, resolve
from .fingerprints import _IMMUTABLE_TYPE, _is_mutable_class
from .state_watch import SLOT_KINDS, _type_dict, class_watch


_READ_ONLY_FUNCTION_ATTRS = ("__closure__", "__globals__", "__builtins__")  # a function keeps these for its life
# type's data descriptors this file reads as a class's own dict: `__module__` is that dict's value for a heap class
_TYPE_SLOTS_READ_AS_DICT = ("__module__",)
_HEAPTYPE = 1 << 9
# Values no watched thing is read through (Note [A watch is of the objects it was built from]): an equal one in its
# place is no other watch; compared by identity, a float set again would only cost a rebind
_NOTHING_WATCHED_THROUGH = (int, float, bool, str, bytes, type(None))
# Objects an attribute read makes anew each time, from what it is read from (anchored itself): a bound method, a
# class's mappingproxy, a builtin bound to its object
_NEW_AT_EACH_READ = (types.MethodType, types.MappingProxyType, types.BuiltinMethodType, types.MethodWrapperType)  # Py_TPFLAGS_HEAPTYPE: a class created by a class statement (or type()), whose names can change

_WATCHED_VALUES = (int, float, bool, str, bytes, type(None), torch.dtype, torch.device, enum.Enum, types.CodeType,
                   types.FunctionType, types.BuiltinFunctionType, types.ModuleType, type)


# Note [A watch is of the objects it was built from]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# The watched dicts, objects, slots and lists are the ones bind found at the end of each pinned path
# (`m.cfg`'s __dict__, `items[0]`'s type). A full check that passes on other objects at those paths
# (`m.cfg = Config()` equal to the old one, a list item replaced by an equal one) proves the guards for
# this call, but a watch of the old objects would then prove nothing about the new ones: a change to
# the new config went unseen and the old value was replayed, fast path or not (found by a helper). So
# the full check also compares each pinned path's object with the one bind found (`anchors`; numbers
# and strings excepted: nothing is watched through them), and when one differs it publishes no watch
# (the fast path stays off) and asks for a new bind (GuardSet.needs_rebind), which the entry makes on
# the objects there now (Loaded._rebind): from the next call the fast path watches those.
# Whether a class-level name is a descriptor, and of which kind, is decided by the type of what the
# class dict holds, so that type and its class dicts are watched too (_watch_descriptors).

# Note [An object passed in is watched while the same one is passed]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# transformers' call passes its KV cache as an object (`past_key_values=StaticCache(...)`), and the trace's guards read
# through it: its layers list, each layer's type, flags and attributes (about 60 checks on Llama's keyword call). An
# argument is no fixed root: another call may pass another object. But most callers pass the same cache step after
# step, so an object argument is pinned as `self.x` is: its dicts, lists and classes are watched, and the argument is
# an anchor (Note [A watch is of the objects it was built from]). The fast path and the residual check first that each
# such argument is the very object the watch watches (`flat_args[1] is H[k]`: one comparison), and the full check
# publishes its watch only when it saw those objects there. A call with another object is checked in full, and the
# entry is bound again on the new one (Loaded._rebind); a caller that passes a new object on every call would pay a
# bind each time, so after _MAX_REBINDS of them the entry binds once more without watching arguments, and its residual
# checks what the arguments hold on every call, as before. The watch holds the watched object's dicts, and so the
# tensors they hold, until the entry is bound again or dropped: one cache kept alive per entry.



def is_argument(path: Path) -> bool:
    """Whether `path` is one argument of the call (`flat_args[i]`), the root of what an object passed in holds."""
    return len(path) == 2 and path[0] == ("L", "flat_args") and path[1][0] == "item"


def _anchorable(value: Any) -> bool:
    """Whether a pinned path's object is compared by identity by the full check (Note [A watch is of the objects it was
    built from]): not a value nothing is watched through, nor one a read makes anew."""
    return type(value) not in _NOTHING_WATCHED_THROUGH and type(value) not in _NEW_AT_EACH_READ


class _Pins:
    """Which paths are pinned by watched dicts (Note [A watched dict proves its guards still hold]): a path is
    pinned when every step from a fixed root reads through a dict (collected in `dicts`) or something that
    cannot change (a bound method's __self__, a tuple item, an object's type: its object is then watched)."""

    def __init__(self, watch_arguments: bool = False) -> None:
        # Note [An object passed in is watched while the same one is passed]
        self.watch_arguments = watch_arguments
        self.dicts: dict[int, dict[Any, Any]] = {}
        self.objects: dict[int, Any] = {}
        self.functions: dict[int, Any] = {}
        self.owners: dict[int, tuple[Any, dict[Any, Any]]] = {}  # Note [A watched dict must stay its object's dict]
        self.slots: dict[tuple[int, int], tuple[Any, int]] = {}  # Note [A slot or a list is watched by what it ...]
        self.lists: dict[int, list[Any]] = {}
        self.counters: dict[int, Any] = {}  # Note [A counter is watched by its value] (csrc/python/state_watch.cpp)
        # Note [A watch is of the objects it was built from]: each pinned path's object, as bind found it
        self.anchors: dict[Path, Any] = {}
        # Note [A transformers config's attribute is read as object's]: what each full check proves again, and where
        self.premises: dict[Path, lookups.Premise] = {}
        self._pinned: dict[Path, bool] = {}
        self._classes: set[int] = set()  # the classes _watch_class watches already
        # Note [A class is watched by everything its digest reads]: the functions watched are those these classes held
        # at bind; a full check that finds others there asks for a new bind
        self.classes: list[type] = []

    # lookups.Watcher: what a proof of another class's lookup asks to be watched
    def watch(self, d: Any) -> bool:
        return self._watch(d)

    def watch_class(self, cls: type) -> None:
        self._watch_class(cls)

    def watch_function(self, f: types.FunctionType) -> None:
        self.functions[id(f)] = f  # StateWatch compares each watched function's code pointer

    def watch_cell(self, cell: types.CellType) -> None:
        self._watch_slot(cell, SLOT_KINDS[types.CellType]["cell_contents"])

    def watch_own(self, owner: Any, own: dict[Any, Any]) -> bool:
        return self._watch_own(owner, own)

    @staticmethod
    def _read_name(value: Any, name: str, at: Path | None) -> str | None:
        """The name object's own lookup reads for `value.name`: `name` where the class's lookup is object's, a
        transformers config's through its attribute_map (Note [A transformers config's attribute is read as object's]),
        None where graphex cannot say (or the value's path is not known)."""
        if type(value).__getattribute__ is object.__getattribute__:
            return name
        return lookups.config_name(value, name) if at is not None else None

    @staticmethod
    def _own_dict(value: Any) -> Any:
        """value's own __dict__, read past its class's lookup where that one is proven to read as object's."""
        if type(value).__getattribute__ is object.__getattribute__:
            return getattr(value, "__dict__", None)
        return object.__getattribute__(value, "__dict__")  # a config lookups proved: it has an exact dict

    def _commit_read(self, value: Any, name: str, read: str, at: Path | None) -> None:
        """A proof that used _read_name holds: watch what made its name right, and prove it again at each full check."""
        if type(value).__getattribute__ is object.__getattribute__ or at is None:
            return
        if at not in self.premises:
            if not lookups.prove(value, self):
                raise AssertionError(f"graphex: the lookup of {type(value).__qualname__} changed while it was proven")
            self.premises[at] = lookups.Premise()
        self.premises[at].reads[name] = read

    def _watch(self, d: Any) -> bool:
        if type(d) is not dict and not isinstance(d, dict):
            return False
        if type(d).__getitem__ is not dict.__getitem__ and type(d).__module__ != "collections":
            return False  # a dict subclass with its own lookup
        self.dicts[id(d)] = d
        return True

    def _watch_own(self, owner: Any, own: Any) -> bool:
        """An instance's own __dict__, watched with its owner (Note [A watched dict must stay its object's dict])."""
        if type(own) is not dict or not self._watch(own):
            return False
        self.owners[id(owner)] = (owner, own)
        return True

    def _watch_slot(self, owner: Any, kind: int) -> bool:
        """A pointer `owner` holds, compared by StateWatch (Note [A slot or a list is watched by what it points to])."""
        self.slots[(id(owner), kind)] = (owner, kind)
        return True

    def _watch_list(self, value: Any) -> bool:
        if type(value) is not list:
            return False
        self.lists[id(value)] = value
        return True

    def _class_attr(self, base: type, name: str) -> bool:
        """`base.name` on a class is fixed while the watched class dicts (the class's MRO and its metaclass's) and
        pointers are: the metaclass looks attributes up as `type` does and defines no `name` of its own, and the
        name is a class slot StateWatch reads, or found in a class dict of the MRO as a plain value or a descriptor
        of a builtin type (a function, classmethod, staticmethod, property: what `__get__(None, base)` gives
        follows from the class). A descriptor of a user's type could compute anything on each read."""
        meta = type(base)
        if meta is not type:
            if meta.__getattribute__ is not type.__getattribute__ or \
                    any(name in vars(m) for m in meta.__mro__ if m is not type and m is not object):
                return False
            self._watch_class(meta)
        self.objects[id(base)] = base  # its metaclass stays (`cls.__class__ = Meta2` is allowed between heap types)
        if name in vars(type) and hasattr(vars(type)[name], "__set__") and name not in _TYPE_SLOTS_READ_AS_DICT:
            if name != "__dict__" and name not in SLOT_KINDS[type]:
                return False  # type's own data descriptor (`__bases__`, `__doc__` ...) wins over any class dict
        if name in _TYPE_SLOTS_READ_AS_DICT and name not in vars(base):
            return False  # read from the class's own dict only, never a base's
        if name == "__dict__":  # the mappingproxy of the class's own dict
            real = _type_dict(base)
            if real is None:
                return False
            self.dicts[id(real)] = real
            return True
        if name in SLOT_KINDS[type]:
            if name != "__mro__" and not base.__flags__ & _HEAPTYPE:
                return True  # a builtin class's names never change
            return self._watch_slot(base, SLOT_KINDS[type][name])
        self._watch_class(base)
        for c in base.__mro__:
            if name in vars(c):
                attr = vars(c)[name]
                if hasattr(type(attr), "__get__") and type(attr).__flags__ & _HEAPTYPE:
                    return False
                self._watch_descriptors(base, name)
                return True
        return False

    def _watch_class(self, cls: type) -> None:
        """What cls's digest reads (Note [A class is watched by everything its digest reads]): the dicts of its MRO,
        which MRO it has (`__bases__` assigned anywhere above gives cls a new MRO tuple and leaves every dict as it
        was: found by a helper), and the functions those dicts hold."""
        if id(cls) in self._classes:
            return
        self._classes.add(id(cls))
        self.classes.append(cls)
        dicts, functions, slots = class_watch(cls)
        for d in dicts:
            self.dicts[id(d)] = d
        for f in functions:
            self.functions[id(f)] = f
        for owner, kind in slots:
            self._watch_slot(owner, kind)

    def pinned(self, path: Path, locals_: dict[str, Any], globals_: dict[str, Any]) -> bool:
        if path in self._pinned:
            return self._pinned[path]
        result = self._pin(path, locals_, globals_)
        self._pinned[path] = result
        if result and len(path) > 1 and path[-1] != ("dict",):  # `dict(cls.__dict__)`: a new copy at each read
            value = resolve(path, locals_, globals_)
            if _anchorable(value):
                self.anchors[path] = value
        return result

    def _watch_descriptors(self, cls: type, name: str) -> None:
        """Whatever `name` is in the class dicts of cls's MRO: its type, and that type's class dicts. Whether it is a
        descriptor, and of which kind, is decided by its type (`D.__set__ = ...` makes an instance attribute lose to
        it; `vars(C)['x'].__class__ = DD` too: found by a helper), which no dict of cls's MRO shows."""
        for c in cls.__mro__:
            if name in vars(c):
                attr = vars(c)[name]
                self.objects[id(attr)] = attr
                self._watch_class(type(attr))

    def _pin(self, path: Path, locals_: dict[str, Any], globals_: dict[str, Any]) -> bool:
        if len(path) == 1:
            return path[0] != ("L", "flat_args")  # func is this CachedFunction's own; G roots are held
        if is_argument(path):
            # Note [An object passed in is watched while the same one is passed]: an object (a StaticCache), not a
            # tensor or a value the call key compares; pinned() makes it an anchor, checked by identity on each call
            # Only an object that is anchored: its identity is what the fast path checks, so an argument read anew
            # at each access (a bound method, a builtin function: `act=torch.relu` then `act=torch.sigmoid` replayed
            # relu when they were pinned unanchored; found by a helper) is not pinned.
            value = resolve(path, locals_, globals_)
            return self.watch_arguments and not isinstance(value, torch.Tensor) and _anchorable(value) and \
                type(value) not in (list, tuple, dict)
        if not self.pinned(path[:-1], locals_, globals_):
            return False
        base = resolve(path[:-1], locals_, globals_)
        step = path[-1]
        if step[0] == "attr":
            name = step[1]
            if isinstance(base, types.MethodType) and name in ("__self__", "__func__"):
                return True
            if isinstance(base, property) and name in SLOT_KINDS[property]:
                # read-only attributes, but `property.__init__` called again replaces them (found by a helper)
                return type(base) is property and self._watch_slot(base, SLOT_KINDS[property][name])
            if type(base) is types.FunctionType and name in _READ_ONLY_FUNCTION_ATTRS:
                return True
            if type(base) is types.FunctionType and name == "__code__":
                self.functions[id(base)] = base  # StateWatch compares each watched function's code pointer
                return True
            if type(base) in (types.FunctionType, types.CellType) and name in SLOT_KINDS[type(base)]:
                return self._watch_slot(base, SLOT_KINDS[type(base)][name])
            if isinstance(base, types.ModuleType):
                return name in vars(base) and self._watch(vars(base))
            if isinstance(base, type):
                return self._class_attr(base, name)
            cls = type(base)
            if name == "__class__" and cls.__getattribute__ is object.__getattribute__ and \
                    not any("__class__" in vars(c) for c in cls.__mro__ if c is not object):
                self.objects[id(base)] = base  # object's own `__class__`: the type, watched as a `type` step is
                return True
            return self._in_own_dict(base, name, path[:-1])
        if step[0] == "object_attr" and step[1] == "__dict__":  # the instance dict itself, watched with its owner
            own = resolve(path, locals_, globals_)
            if not lookups.dict_is_the_instance_dict(type(base)) or type(own) is not dict:
                return False
            self.objects[id(base)] = base
            self._watch_class(type(base))
            return self._watch_own(base, own)
        if step[0] == "object_attr":  # `object.__getattribute__(x, 'name')`: object's lookup, whatever x's class has
            return self._in_own_dict(base, step[1], generic=True)
        if step[0] == "key" and isinstance(base, collections.OrderedDict):
            return False  # the i-th key of an OrderedDict changes with move_to_end, its dict version does not
        if step[0] in ("item", "dict_item", "key"):
            if isinstance(base, tuple) or path[-2] == ("dict",):
                return True  # a tuple cannot change; `dict(cls.__dict__)`'s class dict is watched already
            if step[0] == "item" and type(base) is list:
                return self._watch_list(base)
            return self._watch(base)
        if step[0] in ("item_at", "dict_item_at"):
            return self.pinned(step[1], locals_, globals_) and self._watch(base)
        if step[0] == "type":
            self.objects[id(base)] = base
            return True
        if step[0] == "dict":  # `dict(cls.__dict__)`: the class dict was watched at `__dict__`
            return isinstance(base, types.MappingProxyType) and path[-2] == ("attr", "__dict__")
        return False

    def covers(self, rec: dict[str, Any], path: Path, value: Any, locals_: dict[str, Any],
               globals_: dict[str, Any]) -> bool:
        """Whether the watch proves `rec` while it holds (then the fast path skips it)."""
        if not self.pinned(path, locals_, globals_):
            return False
        kind = rec["kind"]
        if kind == "type":
            self.objects[id(value)] = value
            if _is_mutable_class(type(value)):
                self._watch_class(type(value))
            return True
        if kind in ("id", "same"):
            return kind == "id" or self.pinned(parse_source(rec["arg"]), locals_, globals_)
        if kind == "equals":
            return isinstance(value, _WATCHED_VALUES) or (type(value) is tuple and all(
                isinstance(v, _WATCHED_VALUES) for v in value))
        if kind == "len" and type(value) is list:
            return self._watch_list(value)
        if kind in ("len", "contains"):
            return isinstance(value, tuple) or self._watch(value)
        if kind == "environ":  # os.environ's own dict: putenv through os.environ writes it
            return self._watch(value)
        if kind == "keys":  # order matters: an OrderedDict reorders without a new dict version, unless it has one key
            return (not isinstance(value, collections.OrderedDict) or len(value) <= 1) and self._watch(value)
        if kind == "not_in_dict":
            own = getattr(value, "__dict__", None)
            return isinstance(own, dict) and self._watch_own(value, own)
        if kind == "code" and type(value) is types.FunctionType:
            self.functions[id(value)] = value
            return True
        if kind == "abc":  # Note [An ABC's answers are recorded]: the answers hold while no class is registered
            self.counters[id(abc.get_cache_token)] = abc.get_cache_token
            return True
        if kind == "class":  # Note [What Dynamo reads without a guard is recorded by graphex] (guard_records.py)
            self._watch_class(value)
            self.objects[id(value)] = value  # its metaclass stays
            if _is_mutable_class(type(value)):
                self._watch_class(type(value))
            return True
        if kind == "hasattr" and rec.get("expect") is True:  # torch 2.11: hasattr(layers, "__iter__") on a ModuleList
            return self._found_in_class(value, rec["arg"], path) or self._in_own_dict(value, rec["arg"], path)
        if kind == "hasattr" and rec.get("expect") is False:
            return self._found_nowhere(value, rec["arg"], path)
        return False

    def _found_nowhere(self, value: Any, name: str, at: Path | None = None) -> bool:
        """`hasattr(value, name)` is False while value's type stays, neither its own __dict__ nor a class dict of its
        MRO has the name (all watched), and its class has no `__getattr__`, or nn.Module's, which looks in the
        module's `_parameters`, `_buffers` and `_modules` dicts only (watched too). The name is the one object's lookup
        reads (a transformers config's through its attribute_map)."""
        cls = type(value)
        read = self._read_name(value, name, at)
        if read is None or any(read in vars(c) for c in cls.__mro__):
            return False
        getattr_ = getattr(cls, "__getattr__", None)
        looked_in: list[Any] = []
        if getattr_ is not None:
            if getattr_ is not torch.nn.Module.__getattr__:
                return False
            looked_in = [vars(value).get(d) for d in ("_parameters", "_buffers", "_modules")]
            if any(type(d) is not dict or read in d for d in looked_in):
                return False
        own = self._own_dict(value)
        if own is not None and (type(own) is not dict or read in own or not self._watch_own(value, own)):
            return False
        for d in looked_in:
            self._watch(d)
        self.objects[id(value)] = value
        self._watch_class(cls)
        self._commit_read(value, name, read, at)
        return True

    def _in_own_dict(self, value: Any, name: str, at: Path | None = None, *, generic: bool = False) -> bool:
        """`value.name` is its own __dict__'s value (and `hasattr(value, name)` holds) while that dict has the name, its
        type stays and no class of its MRO gets a data descriptor of that name (the class dicts, and the type of what
        they hold under it, are watched): attribute lookup is object's own (or proven to read as object's:
        Note [A transformers config's attribute is read as object's]), which finds an instance dict's value without
        calling anything. `generic`: the read is `object.__getattribute__(value, name)` (Dynamo 2.11 reads a config
        past its class's lookup so), object's own whatever the class defines."""
        cls = type(value)
        read = name if generic else self._read_name(value, name, at)
        if read is None:
            return False
        if generic and not lookups.dict_is_the_instance_dict(cls):
            return False
        try:
            own = object.__getattribute__(value, "__dict__") if generic else self._own_dict(value)
        except AttributeError:
            return False
        if type(own) is not dict or read not in own:
            return False
        if any(read in vars(c) and hasattr(vars(c)[read], "__set__") for c in cls.__mro__):
            return False  # a data descriptor of the class wins over the instance dict
        self.objects[id(value)] = value
        self._watch_class(cls)
        self._watch_descriptors(cls, read)
        if not self._watch_own(value, own):
            return False
        if not generic:
            self._commit_read(value, name, read, at)
        return True

    def _found_in_class(self, value: Any, name: str, at: Path | None = None) -> bool:
        """`hasattr(value, name)` holds while value's type and its classes' dicts do: the name is a plain function or
        value (no descriptor that could raise) in a class dict of the MRO, and attribute lookup is object's own (or
        proven to read as object's)."""
        cls = type(value)  # its metaclass plays no part: an instance's lookup is the class's __getattribute__
        read = self._read_name(value, name, at)
        if read is None:
            return False
        for c in cls.__mro__:
            if read in vars(c):
                attr = vars(c)[read]
                plain = isinstance(attr, types.FunctionType) or not hasattr(type(attr), "__get__")
                if not plain and not self._attribute_property(value, attr, at):
                    return False
                self.objects[id(value)] = value
                self._watch_class(cls)
                self._watch_descriptors(cls, read)
                self._commit_read(value, name, read, at)
                return True
        return False


    def _attribute_property(self, value: Any, attr: Any, at: Path | None) -> bool:
        """`attr` is a property whose getter only returns an attribute of its object (`return self._output_attentions`,
        as transformers' configs have), and that attribute is value's own dict's: reading the property cannot raise
        while the dicts and the getter's code are watched (Note [A property that returns an attribute holds])."""
        if type(attr) is not property or type(attr.fget) is not types.FunctionType:
            return False
        code, ref = attr.fget.__code__, _returns_an_attribute.__code__
        if (code.co_code, code.co_argcount, code.co_kwonlyargcount, code.co_freevars, len(code.co_names)) != \
                (ref.co_code, ref.co_argcount, ref.co_kwonlyargcount, ref.co_freevars, len(ref.co_names)):
            return False
        if not self._in_own_dict(value, code.co_names[0], at):
            return False
        self.functions[id(attr.fget)] = attr.fget  # its code pointer
        return self._watch_slot(attr, SLOT_KINDS[property]["fget"])  # which function it is: property.__init__ again


# Note [A property that returns an attribute holds]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# `hasattr(config, 'output_attentions') is True` asks whether a property's getter raises, which in general only a call
# can say. A getter whose code is exactly `return self.<name>` (the code of _returns_an_attribute, with its one name;
# a docstring changes no code) raises only where `self.<name>` does, and that read is proved as any other
# (_in_own_dict): so the hasattr holds while the class dicts (the property stays, exactly `property`), the getter's
# code and the instance dict do, all watched.
def _returns_an_attribute(self: Any) -> Any:
    return self.name
