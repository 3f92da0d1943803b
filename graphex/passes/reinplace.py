"""Reinplacing: functional ops go back to writing in place, and we say where we could not.

Note [In-place means in place]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
AOTAutograd functionalizes the graph: `cache.index_copy_(0, pos, v)` on a graph
input becomes `new = index_copy(cache, ...)` plus a `copy_(cache, new)` epilogue,
and a mutable custom op becomes `auto_functionalized(_v2)(op, ...)`, which clones
every mutated argument. Replayed like that, each step would copy the whole cache.

We reuse inductor's reinplacing pass, which proves per op that nothing reads the
old value afterwards and then rewrites it to the in-place form, drops the
epilogue copy, and marks which auto_functionalized arguments still need a clone.
Two changes for graphex:
  * inductor declines to reinplace a scatter into a graph input when it thinks a
    fused functional kernel would be faster; with no fusion here, in place always
    wins, so the pass runs with a table of our own without that heuristic
    (graphex/compat/inductor.py: inductor's table is never modified), keeping only the test
    that the scatter's source is not its own memory (Note [A scatter is not
    reinplaced onto its own source]);
  * the npugraph_ex switches `inplace_pass` (intermediates) and
    `input_inplace_pass` (graph inputs) are honoured by hiding from the pass what
    it must not touch: the epilogue copies (inputs) or, by listing intermediates as
    extra graph outputs for the duration of the pass, their last use (intermediates).
Where a copy is kept we log which later node reads the old value (GRAPHEX_LOG=1).
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Iterator

import torch
import torch.fx
from torch._inductor.fx_passes.post_grad import decompose_auto_functionalized
from torch._inductor.fx_utils import get_node_storage
from torch._inductor.virtualized import V

from ..base.source import display_name, source_line
from ..compat import fake_tensor_updater, inplaceable_ops_table, reinplace_inplaceable_ops
from .aliasing import first_toucher_between, resolve_inplace, root
from .copy_back import Declined, fold_copy_backs

aten = torch.ops.aten
_AUTO_FUNCTIONALIZED = (torch.ops.higher_order.auto_functionalized, torch.ops.higher_order.auto_functionalized_v2)


@dataclasses.dataclass
class KeptCopy:
    """A copy the replay still makes, and why: the decision's own record, read by logs and `graphex triage`.

    `cause` is one of:
      "option"        the user switched the pass off (`option` names which);
      "read-later"    node `reader` reads the old value after the update;
      "not-declared"  a graph input the caller's code does not mutate;
      "replaced"      a graph input overwritten by another tensor (no in-place form exists);
      "unproven"      the alias analysis could not prove the old value dead.
    """

    what: str  # "argument 'cache' of mylib::update_" / "graph input arg2_1"
    reason: str  # the sentence logged after "because"
    cause: str = "unproven"
    node: str = ""  # the FX node whose value is copied (the op's node, or the input's)
    where: str = ""  # the user's source line of the copying op (or of the reader for "read-later")
    reader: str = ""  # for "read-later": the FX node that reads the old value
    option: str = ""  # for "option": input_inplace_pass or inplace_pass

    def __str__(self) -> str:
        return f"kept a copy of {self.what} because {self.reason}"


@dataclasses.dataclass
class _Why:
    reason: str
    cause: str
    reader: str = ""
    where: str = ""
    option: str = ""


def _hidden_input_copy(dst: torch.Tensor, src: torch.Tensor) -> torch.Tensor:
    """Stands in for an epilogue `copy_` while the pass must not see it (input_inplace_pass=False)."""
    return dst.copy_(src)


def reinplace_graph(gm: torch.fx.GraphModule, fake_mode: object, *, intermediates: bool, inputs: bool) -> list[KeptCopy]:
    """Reinplace functional ops of `gm` in place; returns the copies that remain, with reasons."""
    graph = gm.graph
    with V.set_fake_mode(fake_mode):
        with _hide_input_copies(graph, hide=not inputs), _pin_intermediates(graph, pin=not intermediates):
            updater = fake_tensor_updater(gm)
            table = _never_into_overlapping_memory(inplaceable_ops_table(scatter_check=_scatter_source_is_elsewhere))
            reinplace_inplaceable_ops(updater, graph, table)
        explain = _Explainer(graph, intermediates=intermediates, inputs=inputs)
        kept = explain.auto_functionalized_clones()
        decompose_auto_functionalized(graph)
    _remove_self_copies(graph)
    declined = fold_copy_backs(graph, inputs=inputs, intermediates=intermediates)
    graph.eliminate_dead_code()
    kept += _Explainer(graph, intermediates=intermediates, inputs=inputs).input_copies(declined)
    gm.recompile()
    return kept


def _scatter_source_is_elsewhere(node: torch.fx.Node) -> bool:
    """Note [A scatter is not reinplaced onto its own source]
    `x[1:] = x[:-1].clone()` reaches us as `_generalized_scatter(x, clone(x[:-1]), [slice 1:])`, and no-op
    removal drops the clone (its value equals its input's). Reinplaced, the scatter becomes
    `x[1:].copy_(x[:-1])`: a copy that reads what it is overwriting (ATen refuses it when it can see the
    overlap, and is wrong where it cannot). So a scatter whose source is a view of its own base stays
    functional: it writes into a fresh copy of the base. torch 2.15 added the same test to inductor's own
    `should_reinplace_scatter`, which graphex replaces (graphex/compat/inductor.py), so it is ours for every version.
    """
    inp, src = node.args[0], node.args[1]
    if isinstance(inp, torch.fx.Node) and isinstance(src, torch.fx.Node):
        inp_storage = get_node_storage(inp)
        if inp_storage is not None and inp_storage == get_node_storage(src):
            return False
    return True


def _never_into_overlapping_memory(table: dict[object, object]) -> dict[object, object]:
    """Note [Never reinplace into overlapping memory]
    A functional op on a tensor whose elements share memory (`y = x.expand(2, n)`; `y.index_put(...)`)
    first clones it into distinct elements, then writes some of them. Its in-place form would write the
    shared memory, changing every element that aliases the written one (found by the fuzzer: seed 1328,
    `cat` + `expand` + `index_put`). inductor's pass checks that nothing reads the old value, not this;
    each table entry gets an extra check that the mutated argument cannot overlap itself.
    """
    def guarded(entry: object) -> object:
        original = entry.extra_check  # type: ignore[attr-defined]

        def check(node: torch.fx.Node) -> bool:
            for i in entry.mutated_args:  # type: ignore[attr-defined]
                arg = node.args[i] if i < len(node.args) else None
                for a in (arg if isinstance(arg, (list, tuple)) else [arg]):
                    val = a.meta.get("val") if isinstance(a, torch.fx.Node) else None
                    if isinstance(val, torch.Tensor) and _may_overlap_itself(val):
                        return False
            return original(node)

        return dataclasses.replace(entry, extra_check=check)  # type: ignore[type-var]

    return {op: guarded(entry) for op, entry in table.items()}


def _may_overlap_itself(t: torch.Tensor) -> bool:
    """True unless the sizes and strides prove every element has memory of its own (Note [Never reinplace
    into overlapping memory]): sorted by stride, each dim must step past everything the smaller ones reach.
    Symbolic sizes or strides: only a known stride 0 on a dim not known to be 1 counts as overlapping."""
    dims = []
    for size, stride in zip(t.shape, t.stride()):
        size_i = size if isinstance(size, int) else size.node.maybe_as_int()
        stride_i = stride if isinstance(stride, int) else stride.node.maybe_as_int()
        if size_i == 0:
            return False  # no elements
        if size_i == 1:
            continue
        if stride_i == 0:
            return True
        if size_i is None or stride_i is None:
            return False  # symbolic: a view other than expand; assume distinct (as before)
        dims.append((abs(stride_i), size_i))
    reach = 0
    for stride, size in sorted(dims):
        if stride <= reach:
            return True
        reach += stride * (size - 1)
    return False


@contextlib.contextmanager
def _hide_input_copies(graph: torch.fx.Graph, *, hide: bool) -> Iterator[None]:
    hidden = []
    if hide:
        for node in graph.find_nodes(op="call_function", target=aten.copy_.default):
            if isinstance(node.args[0], torch.fx.Node) and node.args[0].op == "placeholder":
                node.target = _hidden_input_copy
                hidden.append(node)
    try:
        yield
    finally:
        for node in hidden:
            if node.graph is graph:
                node.target = aten.copy_.default


@contextlib.contextmanager
def _pin_intermediates(graph: torch.fx.Graph, *, pin: bool) -> Iterator[None]:
    if not pin:
        yield
        return
    output = graph.output_node()
    original = output.args[0]
    n_original = len(original) if isinstance(original, (tuple, list)) else 1
    input_storages = {get_node_storage(p) for p in graph.find_nodes(op="placeholder")}
    pins = [
        n for n in graph.nodes
        if n.op == "call_function" and isinstance(n.meta.get("val"), torch.Tensor)
        and get_node_storage(n) not in input_storages
    ]
    flat = list(original) if isinstance(original, (tuple, list)) else [original]
    output.args = (tuple(flat + pins),)
    try:
        yield
    finally:
        current = list(output.args[0])
        kept = current[:n_original]
        # the output node's args are (outputs,): a tuple or list of outputs (possibly empty) or one node
        output.args = (((tuple(kept) if isinstance(original, tuple) else kept),) if isinstance(original, (tuple, list))
                       else (kept[0],))


class _Explainer:
    """Finds, for each copy the replay still makes, the reason it could not be avoided."""

    def __init__(self, graph: torch.fx.Graph, *, intermediates: bool, inputs: bool) -> None:
        self.graph = graph
        self.intermediates = intermediates
        self.inputs = inputs
        self.epilogue = {n.args[0]: n for n in graph.find_nodes(op="call_function", target=aten.copy_.default)
                         if isinstance(n.args[0], torch.fx.Node) and n.args[0].op == "placeholder"}

    def why(self, op_node: torch.fx.Node, base: torch.fx.Node, stop: torch.fx.Node | None = None) -> _Why:
        """Why the old value of `base` is still needed after `op_node` (until `stop`, the write of the new value:
        readers after it read the new value)."""
        is_input = root(base).op == "placeholder"
        if is_input and not self.inputs:
            return _Why("option input_inplace_pass=False", "option", option="input_inplace_pass")
        if not is_input and not self.intermediates:
            return _Why("option inplace_pass=False", "option", option="inplace_pass")
        epilogue = self.epilogue.get(base)
        reader = first_toucher_between(root(base), op_node, stop,
                                       ignore=frozenset([epilogue]) if epilogue is not None else frozenset())
        if reader is not None:
            return _read_later(reader)
        if is_input and base not in self.epilogue:
            return _Why("the graph must leave that input unchanged (the caller's tensor is not declared mutated)",
                        "not-declared")
        return _Why("the aliasing analysis could not prove the old value dead", "unproven")

    def kept(self, what: str, op_node: torch.fx.Node, base: torch.fx.Node, why: _Why | None = None) -> KeptCopy:
        why = why or self.why(op_node, base)
        return KeptCopy(what, why.reason, cause=why.cause, node=op_node.name,
                        where=why.where or source_line(op_node), reader=why.reader, option=why.option)

    def auto_functionalized_clones(self) -> list[KeptCopy]:
        kept: list[KeptCopy] = []
        for node in self.graph.nodes:
            if node.target not in _AUTO_FUNCTIONALIZED:
                continue
            op = node.args[0]
            clones = node.meta.get("only_clone_these_tensors")
            if node.target is torch.ops.higher_order.auto_functionalized_v2:
                bases = node.kwargs["_all_bases"]
                for i in (range(len(bases)) if clones is None else clones):
                    kept.append(self.kept(f"the tensor {op} mutates ({display_name(bases[i])})", node, bases[i]))
            else:
                from torch._higher_order_ops.auto_functionalize import get_mutable_args

                for name in (get_mutable_args(op)[0] if clones is None else clones):
                    base = node.kwargs.get(name)
                    if isinstance(base, torch.fx.Node):
                        kept.append(self.kept(f"argument '{name}' of {op} ({display_name(base)})", node, base))
        return kept

    def input_copies(self, declined: list[Declined]) -> list[KeptCopy]:
        """Copy-backs into graph inputs left by copy_back.py, explained by the decision that left them."""
        decisions = {d.copy_node: d for d in declined}
        kept: list[KeptCopy] = []
        for base, copy_node in self.epilogue.items():
            src = copy_node.args[1]
            if not isinstance(src, torch.fx.Node):
                continue
            producer = resolve_inplace(src)
            decision = decisions.get(copy_node)
            if decision is None or producer.op != "call_function":
                why = (self.why(producer, base, stop=copy_node) if producer.op == "call_function"
                       else _Why("it is replaced by another tensor", "replaced"))
            elif decision.cause == "option":
                why = _Why(f"option {decision.option}=False", "option", option=decision.option)
            elif decision.cause == "read-later" and decision.reader is not None:
                why = _read_later(decision.reader)
            elif decision.cause == "replaced":
                why = _Why(f"'{producer.name}' ({_target(producer)}) has no in-place form to write the input "
                           "directly", "replaced")
            else:
                why = _Why("the new value does not cover the input with the same sizes, strides and offset, so it "
                           "cannot be computed in place", "unproven")
            kept.append(self.kept(
                f"graph input {display_name(base)} (the new value from '{producer.name}' is written back by a full "
                "copy)", producer, base, why))
        return kept


def _read_later(reader: torch.fx.Node) -> _Why:
    where = source_line(reader)
    return _Why(f"node '{reader.name}' ({_target(reader)}) reads its old value later" + (f" ({where})" if where else ""),
                "read-later", reader=reader.name, where=where)


def _remove_self_copies(graph: torch.fx.Graph) -> None:
    """Drop `copy_(x, y)` where y is x itself after reinplacing (a no-op left by the pass)."""
    for node in list(graph.find_nodes(op="call_function", target=aten.copy_.default)):
        dst, src = node.args[0], node.args[1]
        if isinstance(src, torch.fx.Node) and resolve_inplace(src) is resolve_inplace(dst):  # type: ignore[arg-type]
            node.replace_all_uses_with(dst)  # type: ignore[arg-type]
            graph.erase_node(node)


def _target(node: torch.fx.Node) -> str:
    t = node.target
    if isinstance(t, torch._ops.OpOverload):
        return f"{t._schema.name}.{t._overloadname}"
    return getattr(t, "__name__", str(t))
