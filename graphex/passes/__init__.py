"""Graph passes run on the functional ATen graph AOTAutograd hands us, in order:

  0. stand-ins of kept-whole kernels back to the aten kernel (keep_whole.py; the Dynamo-graph side runs before
     AOTAutograd, in compile.py)
  1. options.post_grad_custom_pre_pass (the user's)
  2. remove no-op ops                (option remove_noop_ops; inductor's pass, snapshots of written inputs kept)
  3. pattern fusion                  (option pattern_fusion_pass; graphex/fusion): on the functional graph,
                                     after no-op removal (a float32 model's .to(float32) is gone, as in the
                                     traced patterns), before CSE (which would merge the per-layer copies of
                                     a node that each pattern expects to own, e.g. ~mask) and before
                                     reinplacing (which then sees fused ops as ordinary functional ops)
     common subexpressions           (option cse; pure ATen calls repeated with the same arguments, cse.py)
  4. reinplace                       (options inplace_pass / input_inplace_pass; see reinplace.py)
  5. operator packets resolved, torch.sym_sum as adds, dead code elimination
  6. options.post_grad_custom_post_pass (the user's)

The result still runs under torch.fx, which is what `force_eager` uses.
"""

from __future__ import annotations

import contextlib
import torch.fx
from torch._inductor.virtualized import V

from ..compat import insertion_successor, on_node_created
from ..options import Options
from .noop import remove_noop_ops_keeping_snapshots
from .cse import eliminate_common_subexpressions
from .keep_whole import restore_kept_kernels
from .overloads import resolve_packets
from .reinplace import KeptCopy, reinplace_graph
from .symbolic import expand_sym_sums

__all__ = ["run_passes", "KeptCopy"]


def run_passes(gm: torch.fx.GraphModule, options: Options, fake_mode: object, name: str = "") -> list[KeptCopy]:
    """Transform `gm` in place; returns the copies the replay still has to make, with reasons."""
    restore_kept_kernels(gm.graph)  # Note [Interpolation runs eager's kernel]
    if options.post_grad_custom_pre_pass is not None:
        options.post_grad_custom_pre_pass(gm.graph)
        gm.recompile()
    with _new_nodes_inherit_source(gm):
        if options.remove_noop_ops:
            with V.set_fake_mode(fake_mode):
                remove_noop_ops_keeping_snapshots(gm.graph)  # Note [A copy of an input is a snapshot]
        if options.pattern_fusion_pass:
            from ..fusion import run_fusion

            with V.set_fake_mode(fake_mode):
                run_fusion(gm, name)
        if options.cse:
            eliminate_common_subexpressions(gm.graph)  # Note [CSE keeps eager's values]
        kept = reinplace_graph(gm, fake_mode, intermediates=options.inplace_pass, inputs=options.input_inplace_pass)
    resolve_packets(gm.graph)
    expand_sym_sums(gm.graph)  # Note [sym_sum is a chain of adds]
    gm.graph.eliminate_dead_code()
    if options.post_grad_custom_post_pass is not None:
        options.post_grad_custom_post_pass(gm.graph)
    gm.graph.lint()
    gm.recompile()
    return kept


def _new_nodes_inherit_source(gm: torch.fx.GraphModule) -> contextlib.AbstractContextManager[None]:
    """Nodes that passes create inherit the user's source line of the node they are inserted before.

    Passes rewrite a node by inserting its replacement just before it; without this,
    the replacement (e.g. the in-place `copy_` that reinplacing makes of a slice
    assignment) would lose the stack trace that errors and dumps show. A create-node
    hook on this GraphModule only: torch.fx itself is not patched.
    """
    def inherit(node: torch.fx.Node) -> None:
        anchor = insertion_successor(node.graph)
        if "stack_trace" not in node.meta and anchor is not None and anchor.meta.get("stack_trace"):
            node.meta["stack_trace"] = anchor.meta["stack_trace"]

    return on_node_created(gm, inherit)
