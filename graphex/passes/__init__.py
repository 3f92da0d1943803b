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
     grouped key/value heads         (option grouped_kv_heads; attention reads GQA heads, not a repeat_kv copy,
                                     grouped_heads.py)
     common subexpressions           (option cse; pure ATen calls repeated with the same arguments, cse.py)
     element-wise chains, pooling    (fused mode only: with option channels_last_conv, 2-d convolutions and the
                                     ops between them in channels_last order, conv_layout.py; max pooling whose
                                     indices nothing reads as graphex_fused::max_pool2d, graphex/fusion/pooling.py;
                                     a partial rotary
                                     and its cat as graphex_fused::partial_rotary, partial_rotary.py; with
                                     option pointwise_fusion, inference batch norms as a multiply and an add
                                     (graphex/fusion/batch_norm.py) and connected element-wise ops of one shape as one
                                     graphex_fused::pointwise, graphex/fusion/chains.py; after CSE, so a
                                     repeated op is computed once inside its chain)
  4. reinplace                       (options inplace_pass / input_inplace_pass; see reinplace.py)
     constant indices as views       (option index_as_view; `x[..., [i], :]` of memory the graph allocated reads a
                                     slice, no copy; after reinplacing, which then has made every write explicit;
                                     index_view.py)
  5. operator packets resolved, torch.sym_sum as adds, read-only copies of constants dropped
     (fresh_constants.py), dead code elimination
  6. options.post_grad_custom_post_pass (the user's)
  7. outputs that were new memory stay new memory (fresh_outputs.py: a copy where a pass left one sharing memory)

Steps 1-6 are PIPELINE, each with the options that switch it: run_passes runs that table, and
`graphex triage` switches each of those options off in turn from the same table (pass_options()).

The result still runs under torch.fx, which is what `force_eager` uses.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any, Callable

import torch.fx
from torch._inductor.virtualized import V

from ..compat import insertion_successor, on_node_created
from ..lowering.streams import annotated_stream, set_stream
from ..options import Options
from .noop import remove_noop_ops_keeping_snapshots
from .cse import eliminate_common_subexpressions
from .fake_values import refresher
from .fresh_constants import read_constants_in_place
from .fresh_outputs import keep_new_outputs_new, outputs_memory
from .grouped_heads import read_grouped_heads_directly
from .index_view import read_constant_indices_through_views
from .keep_whole import restore_kept_kernels
from .overloads import resolve_packets
from .reinplace import KeptCopy, reinplace_graph
from .symbolic import expand_sym_sums

__all__ = ["run_passes", "PassesDone", "KeptCopy", "PIPELINE", "Pass", "pass_options", "switched_off", "is_on"]


@dataclasses.dataclass
class _Run:
    gm: torch.fx.GraphModule
    options: Options
    fake_mode: object
    name: str
    kept: list[KeptCopy] = dataclasses.field(default_factory=list)
    in_place: dict[str, int] = dataclasses.field(default_factory=dict)
    fused: dict[str, int] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class PassesDone:
    """What the passes decided, kept on the compiled graph (CompiledGraph.kept_copies, .in_place, .fused) for tools
    and tests: the copies the replay still makes, with their reasons; the writes reinplacing made in place, per
    in-place op; how often each fusion pattern fired."""
    kept: list[KeptCopy]
    in_place: dict[str, int]
    fused: dict[str, int]


@dataclasses.dataclass(frozen=True)
class Pass:
    name: str
    options: tuple[str, ...]        # the options that switch it off (reinplace: each switches off a part)
    run: Callable[[_Run], None]
    gated: bool = True              # skipped when its option is off; False: it runs and reads its options itself
    inherits_source: bool = True    # nodes it creates get the source line of the node they are inserted before


def _user_pre_pass(r: _Run) -> None:
    r.options.post_grad_custom_pre_pass(r.gm.graph)
    r.gm.recompile()


def _remove_noop_ops(r: _Run) -> None:
    """Note [No-op removal refreshes the fake values it invalidates]
    Replacing a no-op `v = copy(x, a)` by `a` leaves the users' fake values computed on `v`'s own storage;
    the alias analysis of the passes after it (reinplacing) reads storages from those values, and would
    take `a.unsqueeze(0)` for fresh memory and write an input in place (fuzzer seeds 16364, 18544). As in
    inductor's post-grad passes, a refresh made before the removal updates them after it (Note [A pass refreshes
    only the fake values its change reaches])."""
    with V.set_fake_mode(r.fake_mode):
        updater = refresher(r.gm)
        remove_noop_ops_keeping_snapshots(r.gm.graph)  # Note [A copy of an input is a snapshot]
        updater.incremental_update()


def _pattern_fusion(r: _Run) -> None:
    from ..fusion import run_fusion

    with V.set_fake_mode(r.fake_mode):
        updater = refresher(r.gm)
        r.fused = run_fusion(r.gm, r.name)
        updater.incremental_update()  # a view of a replaced call kept its storage (Note [A pass refreshes only ...])


def _cse(r: _Run) -> None:
    with V.set_fake_mode(r.fake_mode):
        updater = refresher(r.gm)
        if eliminate_common_subexpressions(r.gm.graph):  # Note [CSE keeps eager's values]
            # the merged call's users had their values, and views their storage, from the call removed: reinplacing
            # reads which nodes share memory (Note [A pass refreshes only the fake values its change reaches])
            updater.incremental_update()


def _fused_rules(r: _Run) -> None:
    if not r.options.pattern_fusion_pass:
        return  # Note [Element-wise chains are fused by rule, not by pattern]: fused mode only
    with V.set_fake_mode(r.fake_mode):
        updater = refresher(r.gm)
        _fuse_by_rule(r)
        updater.incremental_update()  # Note [A pass refreshes only the fake values its change reaches]


def _fuse_by_rule(r: _Run) -> None:
    from ..base import log
    from ..fusion import say_if_nothing_fused
    from ..fusion.batch_norm import split_batch_norm
    from ..fusion.chains import fuse_elementwise_chains
    from ..fusion.conv_layout import run_convolutions_channels_last
    from ..fusion.partial_rotary import fuse_partial_rotary
    from ..fusion.pooling import replace_max_pool

    def fired(name: str, count: int) -> None:  # one count per fused op, over the patterns and these rules
        total = r.fused.get(name, 0) + count
        if total > 0:
            r.fused[name] = total
        else:
            r.fused.pop(name, None)

    if r.options.channels_last_conv:  # Note [A conv net runs channels_last between its convolutions]
        fired("channels_last_conv", run_convolutions_channels_last(r.gm.graph, r.fake_mode))
    pooled = replace_max_pool(r.gm.graph)  # Note [Max pooling without its indices]
    fired("max_pool2d", pooled)
    partial = fuse_partial_rotary(r.gm.graph)  # Note [A partial rotary writes its tail in the same pass]
    if partial:
        fired("partial_rotary", partial)
        fired("rotary", -partial)  # each absorbed one rotary the patterns counted
    if pooled or partial:
        r.gm.recompile()
    if r.options.pointwise_fusion:
        fired("batch_norm", split_batch_norm(r.gm.graph))  # Note [An inference batch norm is a multiply and an add]
        groups, replaced = fuse_elementwise_chains(r.gm)
        fired("pointwise", groups)
        if groups:
            log.info("%s: element-wise chains: %d ATen calls run as %d fused kernels", r.name, replaced, groups)
    # the patterns' line (run_fusion) counts only them; this one counts every fused kernel of the graph
    log.info("%s: fused mode: %s", r.name,
             ", ".join(f"{name} x{count}" for name, count in sorted(r.fused.items())) or "nothing fused")
    say_if_nothing_fused(r.fused, r.name)  # Note [A fused compile that fused nothing says so]


def _reinplace(r: _Run) -> None:
    done = reinplace_graph(r.gm, r.fake_mode, intermediates=r.options.inplace_pass, inputs=r.options.input_inplace_pass)
    r.kept, r.in_place = done.kept, done.in_place


def _resolve_and_clean(r: _Run) -> None:
    resolve_packets(r.gm.graph)
    expand_sym_sums(r.gm.graph)  # Note [sym_sum is a chain of adds]
    read_constants_in_place(r.gm)  # Note [A constant only read is not copied]: after reinplacing, which may write one
    r.gm.graph.eliminate_dead_code()


def _index_as_view(r: _Run) -> None:
    """Note [A constant index reads through a view]; the readers' fake values are refreshed for the view's strides
    (as no-op removal refreshes them, Note [No-op removal refreshes the fake values it invalidates])."""
    with V.set_fake_mode(r.fake_mode):
        updater = refresher(r.gm)
        done = read_constant_indices_through_views(r.gm, r.fake_mode)
        if done:
            updater.incremental_update()
            from ..base import log

            log.info("%s: %d constant index(es) read through a view (no copy)", r.name, done)


def _grouped_heads(r: _Run) -> None:
    done = read_grouped_heads_directly(r.gm.graph)
    if done:
        from ..base import log

        log.info("%s: %d attention call(s) read grouped key/value heads directly (no repeat_kv copy)", r.name, done)
    r.gm.recompile()


def _user_post_pass(r: _Run) -> None:
    r.options.post_grad_custom_post_pass(r.gm.graph)


# The pipeline, in order: the one definition of which passes run and which option switches each.
PIPELINE: tuple[Pass, ...] = (
    Pass("the user's pre pass", ("post_grad_custom_pre_pass",), _user_pre_pass, inherits_source=False),
    Pass("no-op removal", ("remove_noop_ops",), _remove_noop_ops),
    Pass("pattern fusion", ("pattern_fusion_pass",), _pattern_fusion),
    Pass("attention over grouped key/value heads", ("grouped_kv_heads",), _grouped_heads),
    Pass("common subexpression elimination", ("cse",), _cse),
    Pass("element-wise chains, batch norm, max pooling, channels_last convolutions",
         ("pointwise_fusion", "channels_last_conv"), _fused_rules, gated=False),
    Pass("reinplacing", ("inplace_pass", "input_inplace_pass"), _reinplace, gated=False),
    # after reinplacing: every write is then an explicit in-place op (Note [A constant index reads through a view])
    Pass("constant indices as views", ("index_as_view",), _index_as_view),
    Pass("packets, sym_sum, read-only constants, dead code", (), _resolve_and_clean, gated=False, inherits_source=False),
    Pass("the user's post pass", ("post_grad_custom_post_pass",), _user_post_pass, inherits_source=False),
)


def pass_options() -> tuple[str, ...]:
    """Every option that switches (part of) a pass off, in pipeline order."""
    return tuple(option for p in PIPELINE for option in p.options)


def switched_off(option: str) -> Any:
    """The value of `option` that switches its pass off: None for the user's passes, else False."""
    default = next(f.default for f in dataclasses.fields(Options) if f.name == option)
    return None if default is None else False


def is_on(value: Any) -> bool:
    """An option's value switches its pass on: True, or a callable (the user's passes)."""
    return value is not None and value is not False


def run_passes(gm: torch.fx.GraphModule, options: Options, fake_mode: object, name: str = "",
               new_outputs: list[int] | None = None) -> PassesDone:
    """Transform `gm` in place; returns what the passes decided (the copies the replay still has to make, with
    reasons; the fusion patterns that fired). `new_outputs`: the outputs AOTAutograd hands to the caller as new
    memory (None: every output), which stay new memory (Note [A new output stays new])."""
    restore_kept_kernels(gm.graph)  # Note [Interpolation runs eager's kernel]
    before = outputs_memory(gm.graph)
    run = _Run(gm, options, fake_mode, name)
    for p in PIPELINE:
        if p.gated and not any(is_on(getattr(options, o)) for o in p.options):
            continue
        with _new_nodes_inherit_source(gm) if p.inherits_source else contextlib.nullcontext():
            p.run(run)
    copied = keep_new_outputs_new(gm.graph, before, new_outputs, fake_mode)
    if copied:
        from ..base import log

        log.info("%s: %d output(s) copied, which the passes had left sharing memory (Note [A new output stays new])",
                 name, copied)
    gm.graph.lint()
    gm.recompile()
    return PassesDone(run.kept, run.in_place, run.fused)


def _new_nodes_inherit_source(gm: torch.fx.GraphModule) -> contextlib.AbstractContextManager[None]:
    """Nodes that passes create inherit the user's source line, and the stream, of the node they are inserted before.

    Passes rewrite a node by inserting its replacement just before it; without this,
    the replacement (e.g. the in-place `copy_` that reinplacing makes of a slice
    assignment) would lose the stack trace that errors and dumps show. A create-node
    hook on this GraphModule only: torch.fx itself is not patched.
    """
    def inherit(node: torch.fx.Node) -> None:
        anchor = insertion_successor(node.graph)
        if anchor is None:
            return
        if "stack_trace" not in node.meta and anchor.meta.get("stack_trace"):
            node.meta["stack_trace"] = anchor.meta["stack_trace"]
        # Note [Side streams in a program]: a replacement runs on the stream of what it replaces (a fused kernel
        # made of ops inside `with stream:` stays on that stream, not on the entry stream between its syncs)
        if annotated_stream(anchor) is not None and annotated_stream(node) is None:
            set_stream(node, annotated_stream(anchor))

    return on_node_created(gm, inherit)
