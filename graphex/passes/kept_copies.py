"""What reinplacing decided, as records: the copies the replay still makes and why (Note [Reinplacing decides and
records in one place], reinplace.py). Read by the logs, `graphex triage` and the tests."""

from __future__ import annotations

import dataclasses

import torch
import torch.fx

from ..base.source import display_name, source_line
from .aliasing import first_toucher_between, op_name, resolve_inplace, root
from .copy_back import Declined as Folded

aten = torch.ops.aten


@dataclasses.dataclass
class KeptCopy:
    """A copy the replay still makes, and why: the decision's own record, read by logs and `graphex triage`.

    `cause` is one of:
      "option"           the user switched the pass off (`option` names which);
      "read-later"       node `reader` reads the old value after the update;
      "not-declared"     a graph input the caller's code does not mutate;
      "replaced"         a graph input overwritten by another tensor (no in-place form exists);
      "overlaps-itself"  the written tensor's elements share memory (an expanded view);
      "own-source"       the update reads the very memory it overwrites (`x[1:] = x[:-1]`);
      "returned-view"    the result is returned, and the tensor it would write is a view of a larger one;
      "read-after-copy-back"  written into a graph input, the result would be overwritten by the input's
                         copy-back of another value before it is read;
      "unproven"         the alias analysis could not prove the old value dead.
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


@dataclasses.dataclass(frozen=True)
class Why:
    reason: str
    cause: str
    reader: str = ""
    where: str = ""
    option: str = ""


@dataclasses.dataclass(frozen=True)
class Declined:
    """One decision not to write in place (Note [Reinplacing decides and records in one place])."""

    node: torch.fx.Node  # the functional op
    base: torch.fx.Node  # the tensor it would have written
    what: str  # how a record names the copy
    why: Why


def kept_copy(what: str, node: torch.fx.Node, why: Why) -> KeptCopy:
    return KeptCopy(what, why.reason, cause=why.cause, node=node.name, where=why.where or source_line(node),
                    reader=why.reader, option=why.option)


def input_copies(graph: torch.fx.Graph, declined: list[Declined], folded: list[Folded], *,
                  intermediates: bool, inputs: bool) -> list[KeptCopy]:
    """Each copy-back into a graph input left in the graph, with the decision that left it: the reinplacer's for
    the op that produced the new value, else copy_back.py's."""
    mine = {(d.node, d.base): d.why for d in declined}
    folds = {d.copy_node: d for d in folded}
    kept: list[KeptCopy] = []
    for copy_node in graph.find_nodes(op="call_function", target=aten.copy_.default):
        base, src = copy_node.args[0], copy_node.args[1]
        if not (isinstance(base, torch.fx.Node) and base.op == "placeholder" and isinstance(src, torch.fx.Node)):
            continue
        producer = resolve_inplace(src)
        fold = folds.get(copy_node)
        why = mine.get((producer, base))
        if why is not None:
            pass
        elif producer.op != "call_function":
            why = Why("it is replaced by another tensor", "replaced")
        elif fold is None:
            why = _old_value_needed(producer, base, copy_node, intermediates=intermediates, inputs=inputs)
        elif fold.cause == "option":
            why = Why(f"option {fold.option}=False", "option", option=fold.option)
        elif fold.cause == "read-later" and fold.reader is not None:
            why = read_later(fold.reader)
        elif fold.cause == "replaced":
            why = Why(f"'{producer.name}' ({op_name(producer.target, overload=True)}) has no in-place form to write the input directly",
                       "replaced")
        else:
            why = Why("the new value does not cover the input with the same sizes, strides and offset, so it cannot "
                       "be computed in place", "unproven")
        kept.append(kept_copy(f"graph input {display_name(base)} (the new value from '{producer.name}' is written back "
                          "by a full copy)", producer, why))
    return kept


def _old_value_needed(producer: torch.fx.Node, base: torch.fx.Node, copy_node: torch.fx.Node, *,
                      intermediates: bool, inputs: bool) -> Why:
    """For a copy-back no pass decided on (a non-blocking copy): who reads the input's old value before it."""
    if not inputs:
        return Why("option input_inplace_pass=False", "option", option="input_inplace_pass")
    reader = first_toucher_between(root(base), producer, copy_node, ignore=frozenset([copy_node]))
    if reader is not None:
        return read_later(reader)
    return Why("the aliasing analysis could not prove the old value dead", "unproven")


def read_later(reader: torch.fx.Node) -> Why:
    where = source_line(reader)
    return Why(f"node '{reader.name}' ({op_name(reader.target, overload=True)}) reads its old value later" + (f" ({where})" if where else ""),
                "read-later", reader=reader.name, where=where)
