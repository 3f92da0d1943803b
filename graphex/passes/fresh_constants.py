"""A fresh copy of a constant that is only read: the constant itself.

Note [A constant only read is not copied]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
A tensor the forward creates from data (`torch.tensor([0, 1])`, Falcon's key/value column index) reaches the
functional graph as `lift_fresh_copy(_tensor_constant)`: a copy per call, so that whoever gets the tensor may
write it without changing the constant. Where nothing can, the copy is waste (Falcon's step makes 8 of them, 2.7 us
each, to index with). Reading the constant instead gives every reader the same bytes, in the same layout, so the
result is bitwise eager's. A copy is read only when, after reinplacing (which may turn a reader into a writer):
- it is not an output of the graph (the caller could write it);
- every user is an ATen op (`aten::`: a custom op's schema is its author's word, and one that writes an argument
  it does not declare would write the constant for every later call) whose schema neither writes that argument nor
  returns an alias of it (no view that could be written or returned later; a list argument such as `index`'s
  indices counts as its element);
- the constant has the copy's dtype, sizes and strides (a copy of a non-dense constant is dense, and a kernel may
  take another path on other strides);
- no node of the graph writes the constant itself.
Anything else keeps the copy.
"""

from __future__ import annotations

import torch
import torch.fx

from .aliasing import written_nodes


def read_constants_in_place(gm: torch.fx.GraphModule) -> int:
    """Replace each read-only `lift_fresh_copy(constant)` by the constant (Note [A constant only read is not copied]);
    returns how many were replaced. The dead copies are left for dead code elimination."""
    graph = gm.graph
    copies = list(graph.find_nodes(op="call_function", target=torch.ops.aten.lift_fresh_copy.default))
    if not copies:
        return 0  # most graphs: no alias analysis to pay for
    outputs = {a for n in graph.find_nodes(op="output") for a in n.all_input_nodes}
    written = written_nodes(graph)  # through views too (Note [One alias analysis])
    replaced = 0
    for node in copies:
        (source,) = node.args
        if (not isinstance(source, torch.fx.Node) or source.op != "get_attr" or source in written or node in outputs
                or not _same_tensor_layout(_attr(gm, source), node.meta.get("val"))
                or not all(_only_reads(user, node) for user in node.users)):
            continue
        node.replace_all_uses_with(source)
        replaced += 1
    return replaced


def _attr(gm: torch.fx.GraphModule, node: torch.fx.Node) -> object:
    value: object = gm
    for part in str(node.target).split("."):
        value = getattr(value, part, None)
    return value


def _same_tensor_layout(constant: object, copy: object) -> bool:
    return (isinstance(constant, torch.Tensor) and isinstance(copy, torch.Tensor) and constant.dtype == copy.dtype
            and constant.device == copy.device and tuple(constant.shape) == tuple(copy.shape)
            and tuple(constant.stride()) == tuple(copy.stride()))


def _only_reads(user: torch.fx.Node, value: torch.fx.Node) -> bool:
    """Whether `user` reads `value` and nothing more: an `aten::` op whose schema marks no argument holding `value` as
    written or aliased to an output."""
    target = user.target
    if user.op != "call_function" or not isinstance(target, torch._ops.OpOverload) or target.namespace != "aten":
        return False
    schema = target._schema
    for position, arg in enumerate(schema.arguments):
        given = user.args[position] if position < len(user.args) else user.kwargs.get(arg.name)
        holds = given is value or (isinstance(given, (list, tuple)) and any(g is value for g in given))
        if holds and arg.alias_info is not None:
            return False
    # an argument the node holds that the schema does not name (never for an OpOverload the tracer made): keep
    named = {a.name for a in schema.arguments}
    return all(k in named for k in user.kwargs) and len(user.args) <= len(schema.arguments)
