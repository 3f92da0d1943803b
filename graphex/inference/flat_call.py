"""The function Dynamo traces for cache_compile: the call with its arguments flattened, and the scope its guards
are read in. Kept apart from capture.py (the cold path), so that a process that only replays cache entries never
imports Dynamo's compiler (Note [A cache hit imports no compiler], cache_compile.py)."""

from __future__ import annotations

import keyword
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
    replay would check: Note [cache_compile keys on what the trace read]). So is a call whose
    keyword arguments are leaves too (transformers' `input_ids=..., past_key_values=cache`):
    Note [A keyword call is spelled out].
    """
    keywords = _leaf_keywords(in_spec)
    if keywords == ():
        def flat_call(*flat_args: Any) -> Any:
            return func(*flat_args)
    elif keywords is not None:
        flat_call = _spelled_out(func, in_spec.num_leaves - len(keywords), keywords)
    else:
        def flat_call(*flat_args: Any) -> Any:
            args, kwargs = pytree.tree_unflatten(list(flat_args), in_spec)
            return func(*args, **kwargs)

    flat_call.__code__ = flat_call.__code__.replace()
    return flat_call


# co_filename of a spelled-out keyword call (keys.source_fingerprints: Note [A keyword call is spelled out]).
SPELLED_OUT = "<graphex keyword call>"


def _leaf_keywords(in_spec: pytree.TreeSpec) -> tuple[str, ...] | None:
    """For (args, kwargs) whose every argument and keyword value is a leaf, the keywords in order (() for none);
    else None. A keyword that is not an identifier (`**{"a-b": 1}`) cannot be spelled out: None."""
    children = compat.treespec_children(in_spec)
    if len(children) != 2 or not all(c.is_leaf() for c in compat.treespec_children(children[0])):
        return None
    kwargs = children[1]
    if kwargs.num_nodes == 1 and kwargs.num_leaves == 0:
        return ()
    names = tuple(getattr(kwargs, "context", None) or ())
    if (kwargs.type is not dict or len(names) != kwargs.num_leaves
            or not all(c.is_leaf() for c in compat.treespec_children(kwargs))
            or not all(isinstance(n, str) and n.isidentifier() and not keyword.iskeyword(n) for n in names)):
        return None
    return names


def _spelled_out(func: Callable[..., Any], positional: int, keywords: tuple[str, ...]) -> Callable[..., Any]:
    """`flat_call(*flat_args)` that calls `func(flat_args[0], ..., name=flat_args[k], ...)`.

    Note [A keyword call is spelled out]
    Unflattening the keywords with pytree and calling `func(*args, **kwargs)` makes Dynamo trace pytree and its
    own polyfill for a dict update, and guard both; a cache hit then imports Dynamo to check them (Note [A cache
    hit imports no compiler]). Written out, the call indexes a tuple and passes each keyword by name, which
    Dynamo traces natively. The text is made here, from the keywords only (identifiers, checked), and executed
    in this module's globals, as @dataclass makes its methods; it is part of no user file, and what it depends
    on, the keywords and their order, is the call's pytree spec, which keys the entry. So keys.py does not ask
    for its source (its co_filename is SPELLED_OUT).
    """
    call = [f"flat_args[{i}]" for i in range(positional)]
    call += [f"{name}=flat_args[{positional + j}]" for j, name in enumerate(keywords)]
    source = ("def make(func):\n"
              "    def flat_call(*flat_args):\n"
              f"        return func({', '.join(call)})\n"
              "    return flat_call\n")
    namespace: dict[str, Any] = {}
    exec(compile(source, SPELLED_OUT, "exec"), globals(), namespace)  # noqa: S102 - built from identifiers above
    return namespace["make"](func)


def guards_scope(func: Callable[..., Any], flat_args: list[Any],
                 flat_call: Callable[..., Any] | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
    """The frame Dynamo traced, as guards name it: L is flat_call's locals, G its module's globals."""
    return {"flat_args": flat_args, "func": func}, (flat_call or make_flat).__globals__
