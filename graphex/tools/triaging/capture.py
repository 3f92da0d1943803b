"""What graphex refused or could not do in place: capture errors, custom-op errors, kept copies.

Note [Triage reads fields, never messages]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
graphex's errors carry their explanation as data (`error.finding`: what, where, why, fix,
op, node; Note [Errors are data, rendered at the edge] in graphex/errors.py) and every
copy the replay keeps carries the decision that kept it (passes.KeptCopy: cause, node,
where, reader, option). The findings here are built from those fields; no message is
parsed. Errors from elsewhere (torch, the user's code) are reported by type and first
line, with a fix chosen by their type.
"""

from __future__ import annotations

from typing import Any

import torch

from ...errors import CustomOpError, GraphexError
from .findings import Finding, error_line, root_error
from .runner import ScriptRun


def from_error(e: BaseException, where: str = "") -> Finding | None:
    """A graphex error that explains itself (`e.finding`) as a finding; None for any other error."""
    e = root_error(e)
    fields = getattr(e, "finding", None)
    if not isinstance(e, GraphexError) or fields is None:
        return None
    kind = "custom-op" if isinstance(e, CustomOpError) else "capture"
    return Finding(kind, fields.what, where=fields.where or _frame_of(e) or where, fix=fields.fix,
                   detail="\n".join(filter(None, (fields.detail, fields.why))), op=fields.op, node=fields.node)


def error_findings(run: ScriptRun) -> list[Finding]:
    """Errors raised out of compiled calls, other than graph breaks (breaks.py reports those)."""
    from ...base.source import source_line
    from .breaks import is_graph_break

    findings = []
    for entry in run.compiled:
        e = entry.error
        if e is None or is_graph_break(e):
            continue
        found = from_error(e)
        if found is not None:
            findings.append(found)
            continue
        kind = "graphex error" if isinstance(root_error(e), GraphexError) else "error"
        node = _failing_node(root_error(e))
        where = (source_line(node) if node is not None else "") or _frame_of(root_error(e)) or entry.error_call_at
        findings.append(Finding(
            "capture", f"{entry.name}: {kind} {error_line(e)}", where=where,
            fix=_fix_for_error(e), detail=f"raised by call {entry.error_call} of {entry.name} "
                                          f"(compiled at {entry.compiled_at}, called at {entry.error_call_at})"))
    return findings


def _fix_for_error(e: BaseException) -> str:
    from torch._dynamo.exc import FailOnRecompileLimitHit
    from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode

    root = root_error(e)
    if isinstance(root, FailOnRecompileLimitHit) or \
            getattr(root, "gb_type", "") == "Dynamo recompile limit exceeded":
        return "see the recompiles section: make the changing input constant or dynamic."
    if isinstance(root, GuardOnDataDependentSymNode):
        node = _failing_node(root)
        names = _int_tensor_inputs(node) if node is not None else []
        name = names[0] if names else "NAME"
        return (f"a value read from a tensor ({name}) is used as an index, a size or a slice bound, and a compiled "
                f"graph cannot depend on tensor data. Pass {name} as a Python int instead of a tensor and let "
                f"Dynamo treat it as dynamic: add the line torch.compiler.config.dynamic_sources = \"L['{name}']\" "
                f"before the first call; index with t.select(DIM, {name}) (and .copy_(v) to write) rather than "
                f"t[:, {name}], which would specialize on each value; slices such as t[:, :{name} + 1] are fine.")
    return "run the script with GRAPHEX_LOG=1 (and TORCHDYNAMO_VERBOSE=1) to see where it fails."


def _failing_node(e: BaseException) -> torch.fx.Node | None:
    """The FX node torch.fx's Interpreter was running when `e` was raised (a local of its frame)."""
    tb, node = e.__traceback__, None
    while tb is not None:
        candidate = tb.tb_frame.f_locals.get("node") if tb.tb_frame.f_code.co_name == "run" else None
        if isinstance(candidate, torch.fx.Node) and candidate.op == "call_function":
            node = candidate
        tb = tb.tb_next
    return node


def _int_tensor_inputs(node: torch.fx.Node) -> list[str]:
    """The user's names of the graph inputs feeding `node` that are one-element integer tensors."""
    from ...base.source import pretty_source

    names = []
    for arg in node.all_input_nodes:
        value = arg.meta.get("example_value")
        source = getattr(arg, "_dynamo_source", None)
        if (arg.op == "placeholder" and source is not None and isinstance(value, torch.Tensor)
                and value.numel() == 1 and not value.is_floating_point()):
            names.append(pretty_source(source.name))
    return names


def _frame_of(e: BaseException) -> str:
    from .findings import is_internal, location

    stack = [f for f in getattr(e, "real_stack", None) or [] if not is_internal(f.filename)]
    if stack:
        f = stack[-1]
        return location(f.filename, f.lineno or 0, f.name, (f.line or "").strip() or None)
    return ""


def autograd_findings(run: ScriptRun) -> list[Finding]:
    """Compiled functions first called with autograd on: graphex ran them on AOTAutograd's eager path."""
    return [Finding("capture", f"{c.name} was called with grad enabled and tensors that require grad: graphex ran "
                               "it on AOTAutograd's eager path, not on the engine", where=c.first_call_at,
                    fix="for inference, call it under torch.no_grad() or torch.inference_mode() (or "
                        "requires_grad_(False) on the parameters).", problem=False)
            for c in run.compiled if c.first_needs_grad and c.is_graphex]


def kept_copy_findings(graphs: list[Any], user_copies: dict[str, tuple[int, str]] | None = None) -> list[Finding]:
    """Every copy the replay still makes (CompiledGraph.kept_copies), once per distinct copy.

    Note [A copy the user wrote is not a problem]
    A kept copy is one graphex could not avoid, but not always one graphex added: with
    `y = x.clone(); op_(y); use(x)` the user asked for the copy, and functionalization only
    moves it. `user_copies` (graph name -> (clones and copy_ calls in the Dynamo graph, the
    first one's source line), recorded by the runner) tells them apart: when the replay's
    graph copies no more than the user's code does, its kept copies are the user's own and
    are reported as notes, not problems (exit code 0).
    """
    found: dict[tuple[str, str], Finding] = {}
    for graph in graphs:
        mine = (user_copies or {}).get(graph.name)
        deliberate = mine is not None and _copies_in(graph.gm) <= mine[0]
        for copy in graph.kept_copies:
            key = (copy.what, copy.reason)
            if key in found:
                found[key].count += 1
                continue
            if deliberate:
                finding = Finding("kept-copy", f"{graph.name}: kept a copy of {copy.what}, the copy your code makes",
                                  where=mine[1] or copy.where, detail=f"because {copy.reason}; the replay copies no more "
                                                           f"than your code does ({mine[1]})", problem=False,
                                  node=copy.node)
            else:
                finding = Finding("kept-copy", f"{graph.name}: kept a copy of {copy.what}", where=copy.where,
                                  fix=_fix_for_copy(copy), detail=f"because {copy.reason}", node=copy.node,
                                  problem=copy.cause not in _COPIES_THE_CODE_ASKS_FOR)
            found[key] = finding
    return list(found.values())


def _copies_in(gm: torch.fx.GraphModule) -> int:
    """Whole-tensor copies the replay makes: clones and copy_ write-backs."""
    aten = torch.ops.aten
    return sum(1 for n in gm.graph.nodes if n.op == "call_function" and n.target in (aten.clone.default,
                                                                                      aten.copy_.default))


def user_copies(gm: torch.fx.GraphModule) -> tuple[int, str]:
    """Clones and copy_ calls in a Dynamo graph (the user's own copies), and the first one's source line."""
    from ...base.source import source_line

    copies = [n for n in gm.graph.nodes
              if (n.op == "call_method" and n.target in ("clone", "copy_"))
              or (n.op == "call_function" and n.target in (torch.clone, torch.Tensor.clone, torch.Tensor.copy_))]
    return len(copies), (source_line(copies[0]) if copies else "")


# the causes of a kept copy that are what the user's code asks for (graphex.passes.KeptCopy): no finding to fix
_COPIES_THE_CODE_ASKS_FOR = ("replaced", "own-source", "overlaps-itself", "returned-view", "read-after-copy-back")


def _fix_for_copy(copy: Any) -> str:
    if copy.cause == "option":
        return (f"remove options={{'{copy.option}': False}} (the default is True): graphex then writes the "
                "update in place instead of copying the whole tensor on every call.")
    if copy.cause == "read-later":
        reader = f" ({copy.reader}" + (f", {copy.where}" if copy.where else "") + ")" if copy.reader else ""
        return (f"move that read{reader} before the in-place update, or read the updated tensor instead: while "
                "the old value is still needed, the replay must copy the whole tensor on every call.")
    if copy.cause == "not-declared":
        return ("if the caller's tensor is meant to change, update it in the model (tensor.copy_(...), "
                "index_copy_, or a custom op that declares it in mutates_args); otherwise pass a tensor the op "
                "may own.")
    if copy.cause == "own-source":
        return ("none needed: the update reads the memory it overwrites (like x[1:] = x[:-1]), so it is computed into a "
                "fresh copy, as eager's kernel would need too.")
    if copy.cause == "overlaps-itself":
        return ("none needed unless the tensor should not be an expanded view: its elements share memory, so it "
                "cannot be written in place; write into a tensor with memory of its own (.contiguous()) instead.")
    if copy.cause == "returned-view":
        return ("none needed: the result is returned, so it gets memory of its own, as eager's does; written in "
                "place it would be a view of a larger tensor.")
    if copy.cause == "read-after-copy-back":
        return ("none needed: the result is read after the code writes another value into the same input, so it "
                "keeps memory of its own, as eager's does.")
    if copy.cause == "replaced":
        return ("none needed: the code overwrites the whole input with another tensor, so a full copy is what it "
                "asks for.")
    return ("none known: graphex could not prove the old value dead, so it keeps the copy (correct, one full "
            "copy per call); GRAPHEX_LOG=1 logs the graph around it.")
