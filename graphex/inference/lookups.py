"""Objects whose class defines its own `__getattribute__`, read as object's own lookup where graphex can prove the two
agree (Note [A transformers config's attribute is read as object's]): transformers' configs."""

from __future__ import annotations

import types
from typing import Any, Callable

# Note [A transformers config's attribute is read as object's]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# A guard on `config.return_dict` is proven by the watch (Note [A watched dict proves its guards still hold]) only where
# the read is object's own lookup: a class's own Python `__getattribute__` could compute anything on each read. So the
# guards on transformers' configs (a dozen on a decode step, each `hasattr(config, 'x') is False` an exception raised
# through two Python frames) were checked on every cache_compile call: 65 us of Llama's keyword call after a real step.
# A config's class has two, and what they do is known:
#   * PreTrainedConfig's reads `name` as `attribute_map.get(name, name)` (GPT-2's `num_hidden_layers` is its `n_layer`),
#     `attribute_map` read by the next lookup in the MRO;
#   * HeterogeneousConfigMixin's raises or logs for a per-layer attribute when the instance dict holds
#     `_heterogeneity_spec`, and otherwise is the next lookup, object's.
# So a config's `name` is object's lookup of `attribute_map.get(name, name)` while: the MRO's `__getattribute__`s are
# exactly those two functions (their code equal to the copies below, so another transformers version with the same
# code is recognized and a changed one is not) and then object's; each function's `__class__` cell (what its `super()`
# reads) holds the class that defines it, and neither's globals shadow `super`, which is the builtin; the instance dict
# has no `_heterogeneity_spec` and no `attribute_map`; `attribute_map` is an exact dict of str to str found in a class
# dict of the MRO; every `__dict__` in a class dict of the MRO is the getset descriptor types give. Each of those is
# watched (the class dicts and MRO, the functions' code, the cells, the globals and builtins dicts, the attribute_map,
# the instance dict), and since a full check snapshots a new watch of those same things, each full check proves the
# premises again (a `_Premise` line) before its watch is published: a change the watch saw that broke one is never
# carried into the next snapshot. Any other class keeps its guards in the every-call checks, as before.


class _PreTrainedConfigLookup:  # transformers.configuration_utils.PreTrainedConfig.__getattribute__ (5.x), verbatim
    def __getattribute__(self, key):
        if key != "attribute_map" and key in super().__getattribute__("attribute_map"):
            key = super().__getattribute__("attribute_map")[key]
        return super().__getattribute__(key)


class _HeterogeneousConfigLookup:  # transformers' HeterogeneousConfigMixin.__getattribute__ (5.x), strings rewrapped
    def __getattribute__(self, key: str) -> Any:
        heterogeneity_spec = super().__getattribute__("__dict__").get("_heterogeneity_spec")
        if heterogeneity_spec is not None:
            if key in heterogeneity_spec.per_layer_attributes:
                if not super().__getattribute__("allow_global_per_layer_attribute_access"):
                    raise AmbiguousGlobalPerLayerAttributeError(  # noqa: F821  (transformers' own; never run here)
                        f"'{key}' is a per-layer attribute and may vary across layers. Access it via the individual "
                        f"layer configs instead (e.g. config.per_layer_config[i].{key}). To read the global config "
                        f"value from config.{key} anyway, set `allow_global_per_layer_attribute_access` to `True` on "
                        f"the config. Warning: only do this if the caller can safely handle heterogeneous configs; "
                        f"code that assumes a homogeneous model may use the global value incorrectly."
                    )

                logger.warning_once(  # noqa: F821
                    f"Reading global config value for per-layer attribute `{key}` on a heterogeneous config. "
                    "Only do this if the caller can safely handle heterogeneous configs; code that assumes a "
                    "homogeneous model may use the global value incorrectly."
                )

        return super().__getattribute__(key)


_KNOWN_CHAIN = (vars(_PreTrainedConfigLookup)["__getattribute__"], vars(_HeterogeneousConfigLookup)["__getattribute__"])


def _same_code(f: Any, reference: types.FunctionType) -> bool:
    if type(f) is not types.FunctionType:
        return False
    a, b = f.__code__, reference.__code__
    return (a.co_code, a.co_consts, a.co_names, a.co_varnames, a.co_freevars, a.co_argcount, a.co_flags) == \
        (b.co_code, b.co_consts, b.co_names, b.co_varnames, b.co_freevars, b.co_argcount, b.co_flags)


class Watcher:
    """What a proof asks to be watched (graphex/inference/pins.py's _Pins provides it)."""

    watch: Callable[[Any], bool]  # a dict, by its version
    watch_class: Callable[[type], None]  # a class's MRO and its dicts
    watch_function: Callable[[types.FunctionType], None]  # its code pointer
    watch_cell: Callable[[types.CellType], None]  # its contents
    watch_own: Callable[[Any, dict[Any, Any]], bool]  # an instance's own dict, with its owner


def config_name(value: Any, name: str) -> str | None:
    """The name object's lookup reads for `value.name` (Note [A transformers config's attribute is read as object's]),
    or None when `value`'s class lookup is not known to be object's."""
    proof = _proof(value)
    return None if proof is None else _read(proof[0], name)


def prove(value: Any, watcher: Watcher) -> bool:
    """Whether value's lookup reads as object's, watching every premise through `watcher` when it does."""
    proof = _proof(value)
    if proof is None:
        return False
    attribute_map, functions, own = proof
    watcher.watch_own(value, own)
    watcher.watch_class(type(value))
    watcher.watch(attribute_map)
    for f in functions:
        watcher.watch_function(f)
        watcher.watch_cell(f.__closure__[0])
        watcher.watch(f.__globals__)
        watcher.watch(f.__builtins__)
    return True


def dict_is_the_instance_dict(cls: type) -> bool:
    """Whether object's lookup of `__dict__` on an instance of cls gives the instance dict: every `__dict__` its MRO's
    class dicts hold is the getset descriptor types give (a class's own `__dict__` property could give anything)."""
    return not any("__dict__" in vars(c) and type(vars(c)["__dict__"]) is not types.GetSetDescriptorType
                   for c in cls.__mro__)


def _read(attribute_map: dict[str, str], name: str) -> str:
    return attribute_map.get(name, name) if name != "attribute_map" else name


def _proof(value: Any) -> tuple[dict[str, str], list[types.FunctionType], dict[str, Any]] | None:
    """(the attribute_map, the two lookup functions, the instance dict) where value's lookup reads as object's."""
    cls = type(value)
    chain = [c for c in cls.__mro__ if "__getattribute__" in vars(c)]
    if len(chain) != 3 or chain[-1] is not object:
        return None
    functions = [vars(c)["__getattribute__"] for c in chain[:2]]
    if not all(_same_code(f, ref) for f, ref in zip(functions, _KNOWN_CHAIN)):
        return None
    for f, owner in zip(functions, chain):
        cells = f.__closure__
        if cells is None or len(cells) != 1 or cells[0].cell_contents is not owner:
            return None
        builtins = f.__builtins__
        if "super" in f.__globals__ or type(builtins) is not dict or builtins.get("super") is not super:
            return None
    if not dict_is_the_instance_dict(cls):
        return None
    own = object.__getattribute__(value, "__dict__")
    if type(own) is not dict or "_heterogeneity_spec" in own or "attribute_map" in own:
        return None
    found = [vars(c)["attribute_map"] for c in cls.__mro__ if "attribute_map" in vars(c)]
    if not found or type(found[0]) is not dict:
        return None
    attribute_map = found[0]
    if not all(type(k) is str and type(v) is str for k, v in attribute_map.items()):
        return None
    return attribute_map, functions, own


class Premise:
    """The names read from one object still read as object's lookup of the same names: the line each full check runs
    before it publishes a watch (Note [A transformers config's attribute is read as object's])."""

    def __init__(self) -> None:
        self.reads: dict[str, str] = {}

    def __call__(self, value: Any) -> bool:
        proof = _proof(value)
        return proof is not None and all(_read(proof[0], name) == read for name, read in self.reads.items())

    def __repr__(self) -> str:
        return f"Premise({self.reads!r})"
