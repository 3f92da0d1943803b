"""The function Dynamo traces for cache_compile: the call with its arguments flattened, and the scope its guards
are read in. Kept apart from capture.py (the cold path), so that a process that only replays cache entries never
imports Dynamo's compiler (Note [A cache hit imports no compiler], cache_compile.py)."""

from __future__ import annotations

import keyword
import unicodedata
from typing import Any, Callable

from torch.utils import _pytree as pytree

from .. import compat


def make_flat(func: Callable[..., Any], in_spec: pytree.TreeSpec) -> Callable[..., Any]:
    """The call with its arguments flattened, as a function with a code object of its own.

    Note [A fresh code object per cold compile]
    Dynamo caches compiled frames per code object and gives up after
    torch._dynamo.config.recompile_limit (8) entries, which with fullgraph=True is a hard
    failure. cache_compile compiles once per input signature and never asks Dynamo again
    for it (hits replay the entry), so each cold compile gets a copy of `flat_call`'s
    code (`code.replace()` makes a new object): every copy holds one cache entry and
    is freed with the function, and a 9th batch size compiles like the first.

    A call of positional tensors and numbers only (the common one) is passed on as it is, so
    the trace does not go through pytree (whose internals Dynamo would guard, and every
    replay would check: Note [cache_compile keys on what the trace read]). Any other call whose
    structure is plain (keywords, lists, tuples, dicts, None: transformers' `input_ids=...,
    past_key_values=cache`) is spelled out: Note [A call is spelled out].
    """
    if _positional_leaves(in_spec):
        def flat_call(*flat_args: Any) -> Any:
            return func(*flat_args)
    elif (spelled := _call_text(in_spec)) is not None:
        flat_call = _spelled_out(func, spelled)
    else:
        def flat_call(*flat_args: Any) -> Any:
            args, kwargs = pytree.tree_unflatten(list(flat_args), in_spec)
            return func(*args, **kwargs)

    flat_call.__code__ = flat_call.__code__.replace()
    return flat_call


# co_filename of a spelled-out call (keys.source_fingerprints: Note [A call is spelled out]).
SPELLED_OUT = "<graphex spelled-out call>"


def _positional_leaves(in_spec: pytree.TreeSpec) -> bool:
    """(args, kwargs) with no kwargs and every arg a leaf."""
    children = compat.treespec_children(in_spec)
    return (len(children) == 2 and children[1].num_leaves == 0 and children[1].num_nodes == 1
            and all(c.is_leaf() for c in compat.treespec_children(children[0])))


def _call_text(in_spec: pytree.TreeSpec) -> str | None:
    """The arguments of `func(...)` as source over `flat_args` (`flat_args[0], [flat_args[1], flat_args[2]],
    scale=flat_args[3]`), for (args, kwargs) built only of leaves, lists, tuples, dicts keyed by str or int, and
    None; else None (pytree rebuilds the call)."""
    children = compat.treespec_children(in_spec)
    if len(children) != 2 or children[0].type is not tuple or children[1].type is not dict:
        return None
    counter = iter(range(in_spec.num_leaves))
    keywords = list(children[1].context or ())
    if not all(_spells_itself(k) for k in keywords):
        return None
    values = [_value_text(c, counter) for c in compat.treespec_children(children[0])]
    named = [_value_text(c, counter) for c in compat.treespec_children(children[1])]
    if None in values or None in named:
        return None
    return ", ".join([*values, *(f"{k}={v}" for k, v in zip(keywords, named))])  # type: ignore[arg-type]


def _value_text(spec: pytree.TreeSpec, counter: Any) -> str | None:
    if spec.is_leaf():
        return f"flat_args[{next(counter)}]"
    items = [_value_text(c, counter) for c in compat.treespec_children(spec)]
    if None in items:
        return None
    if spec.type is list:
        return f"[{', '.join(items)}]"
    if spec.type is tuple:
        return f"({', '.join(items)}{',' if len(items) == 1 else ''})"
    if spec.type is dict:
        keys = list(spec.context or ())
        if not all(type(k) in (str, int) for k in keys):
            return None
        return "{" + ", ".join(f"{k!r}: {v}" for k, v in zip(keys, items)) + "}"
    if spec.type is type(None):
        return "None"
    return None  # a namedtuple, an OrderedDict, a registered class: pytree rebuilds it


def _spells_itself(name: Any) -> bool:
    """A keyword that, written in source, names itself: an identifier, not a Python keyword, and unchanged by the
    NFKC normalization Python applies to identifiers in source (`**{"\ufb01": t}` would reach the function as
    `fi`; found by a helper)."""
    return (isinstance(name, str) and name.isidentifier() and not keyword.iskeyword(name)
            and unicodedata.normalize("NFKC", name) == name)


def _spelled_out(func: Callable[..., Any], call: str) -> Callable[..., Any]:
    """`flat_call(*flat_args)` that calls `func(<call>)`.

    Note [A call is spelled out]
    Unflattening the arguments with pytree and calling `func(*args, **kwargs)` makes Dynamo trace pytree and its
    own polyfill for a dict update, and guard both; a cache hit then imports Dynamo to check them (Note [A cache
    hit imports no compiler]). Written out, the call indexes a tuple, builds its lists, tuples and dicts as
    displays and passes each keyword by name, all of which Dynamo traces natively. The text is made here from the
    call's pytree spec only (indices, dict keys by repr, keywords that are identifiers naming themselves), and
    executed in this module's globals, as @dataclass makes its methods; it is part of no user file, and what it
    depends on, the spec, keys the entry. So keys.py does not ask for its source (its co_filename is SPELLED_OUT).
    """
    source = ("def make(func):\n"
              "    def flat_call(*flat_args):\n"
              f"        return func({call})\n"
              "    return flat_call\n")
    namespace: dict[str, Any] = {}
    exec(compile(source, SPELLED_OUT, "exec"), globals(), namespace)  # noqa: S102 - built from the spec above
    return namespace["make"](func)


def guards_scope(func: Callable[..., Any], flat_args: list[Any],
                 flat_call: Callable[..., Any] | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
    """The frame Dynamo traced, as guards name it: L is flat_call's locals, G its module's globals."""
    return {"flat_args": flat_args, "func": func}, (flat_call or make_flat).__globals__
