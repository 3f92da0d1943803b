"""The options of the graphex backend: `torch.compile(..., options={...})`.

Every option is declared once here, with its type, default and meaning; the
docs/backend.md's option table is generated from the same text (`python -m graphex options`, scripts/update_docs.py).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Callable



@dataclasses.dataclass(frozen=True)
class _Spec:
    """What `from_user` checks of one option, and what `graphex options` prints."""
    types: tuple[Any, ...]
    doc: str
    choices: tuple[Any, ...] | None = None  # the only values allowed
    minimum: int | None = None
    keyed: bool = True  # part of a cache entry's key (False: it does not change the program made)


def _option(default: Any, types: tuple[Any, ...], doc: str, *, choices: tuple[Any, ...] | None = None,
            minimum: int | None = None, keyed: bool = True) -> Any:
    """One option: its default, the types it takes, its meaning (Note [An option is declared once])."""
    return dataclasses.field(default=default, metadata={"spec": _Spec(types, doc, choices, minimum, keyed)})


@dataclasses.dataclass(frozen=True)
class Options:
    """Note [An option is declared once]
    Each field below is one option: its name, type, default and meaning in one place. The validation
    (`from_user`), docs/backend.md's table and `graphex options` (`option_docs`), the cache key
    (`cache_key`) and triage (graphex.passes' pass options) all read these fields; nothing repeats
    a default or a name."""

    force_eager: bool = _option(
        False, (bool,),
        "Run the optimized ATen graph (after all graphex passes) with PyTorch's FX "
        "interpreter instead of the C++ engine. For bisecting: if results differ with "
        "False but not with True, the engine is at fault; otherwise a pass is.")

    capture_limit: int = _option(
        64, (int,),
        "Most device graphs (one per concrete input signature) one compiled graph captures, "
        "as in npugraph_ex; past the limit, new input signatures run on graphex's engine without a "
        "device graph, with one warning. The CPU "
        "engine captures no device graphs: a dynamic=True program is one program that serves "
        "every shape and int value, so on the CPU the limit is never reached.", minimum=1)

    clone_output: bool = _option(
        False, (bool,),
        "Clone every output the graph computes before returning it. On CPU outputs are "
        "always fresh tensors, so this only costs a copy; kept for npugraph_ex scripts. Device graphs copy every "
        "output they compute out of the graph's pool whatever this says (Note [Device graph outputs are never "
        "overwritten]), so it adds nothing there.")

    frozen_parameter: bool = _option(
        False, (bool,),
        "Treat parameters and buffers as constants of the captured program: they are bound "
        "once, on the first call, instead of on every call, and ops that read only them (the "
        "t() of each linear weight, products of parameters) are computed once, bit for bit. "
        "In-place updates and `.data =` are seen; replacing a parameter or buffer object, or "
        "changing one a folded value came from (any write, `.data` and views included), is "
        "detected on the next call (a pointer compare per parameter; a byte compare of the few "
        "under 64 KiB that computed values were folded from, and in fused mode of each convolution weight "
        "read reordered, see prepack_conv_weights) and the program is re-lowered "
        "(logged; a warning after 3).")

    clone_input: bool = _option(
        True, (bool,),
        "Device graphs (npugraph_ex's option of the same name): copy each user input into a static buffer "
        "the graph owns before every replay, so a caller may pass new tensors each call. False: the graph is "
        "captured on the first caller's buffers (no copy while the caller passes the same tensors; another "
        "address is copied into them). Parameters, buffers and inputs the program writes in place (a KV "
        "cache) are never copied: they are captured on their own memory and checked per call. CPU: no effect.")

    use_graph_pool: tuple[int, int] | None = _option(
        None, (type(None), tuple),
        "Device graphs: a memory pool id (e.g. torch.cuda.graph_pool_handle(), or another graph's pool()) "
        "that every device graph compiled with these options allocates from, so graphs of several compiled "
        "functions share memory (npugraph_ex's option). None: see reuse_graph_pool_in_same_fx. CPU: no effect.")

    reuse_graph_pool_in_same_fx: bool = _option(
        True, (bool,),
        "Device graphs: the graphs one compiled graph captures for its input signatures share one memory "
        "pool (npugraph_ex's option). False: a private pool per device graph. CPU: no effect.")

    force_recapture: bool = _option(
        False, (bool,),
        "Device graphs (npugraph_ex's option of the same name): capture the device graph again before every "
        "call instead of replaying the one captured, to tell a wrong result of replaying a stale capture from "
        "one of the program itself. Every call pays a capture: for debugging only. CPU: no effect.")

    capture_error_mode: str = _option(
        "default", (str,),
        "Device graphs: what the device's capture refuses, as torch.accelerator.Graph takes it: 'default', "
        "'global', 'thread_local' or 'relaxed' (CUDA's cudaStreamCaptureMode). CPU: no effect.", choices=("default", "global", "thread_local", "relaxed"))

    inplace_pass: bool = _option(
        True, (bool,),
        "Reinplace functional ops on intermediates (auto_functionalized custom ops, "
        "index_put, scatter) so they write in place instead of cloning.")

    input_inplace_pass: bool = _option(
        True, (bool,),
        "Turn 'out-of-place op + copy_ back into the input' (what functionalization makes of "
        "an in-place update of a graph input, e.g. a KV cache) back into the in-place op, so "
        "the caller's tensor is written directly with no copy.")

    remove_noop_ops: bool = _option(
        True, (bool,),
        "Drop ops that do nothing (clone of a dead value, view to the same shape, "
        "same-dtype conversion, ...).")

    grouped_kv_heads: bool = _option(
        True, (bool,),
        "Attention over grouped key/value heads (GQA: a repeat_kv of the cache, as transformers writes it when "
        "compiled) reads the grouped heads directly instead of a repeated copy: the same value, bit for bit "
        "(CPU flash attention takes fewer key/value heads natively), without copying the KV cache per layer "
        "and step.")

    index_as_view: bool = _option(
        False, (bool,),
        "Read a gather of constant consecutive positions (`x[..., [i], :]`, Falcon's key and value heads out of its "
        "fused projection) through a slice of x instead of copying it: the same values and strides, bit for bit, "
        "without the copy; only for memory the graph allocated, where nothing writes it or the result and the "
        "result is not returned (Note [A constant index reads through a view]). Off by default: on Falcon's "
        "one-token step its gain was within this project's measuring noise (engine 0.95-1.06x in three paired runs).")

    cse: bool = _option(
        True, (bool,),
        "Compute a pure ATen call repeated with the same arguments once (a mask or a table "
        "recomputed per layer): the same value, bit for bit. Custom operators are never merged.")

    direct_call: bool = _option(
        True, (bool,),
        "Where AOTAutograd's per-call wrapper would only bump the version counters of the inputs the graph mutates "
        "and turn grad mode off (no mutation left to apply, no output aliasing an input), Dynamo calls graphex's "
        "C++ DirectCall instead, which does exactly those two: the same results, tens of microseconds less per "
        "call after a real step. False keeps AOTAutograd's wrapper on every graph.")

    pattern_fusion_pass: bool = _option(
        False, (bool,),
        "Fused mode (npugraph_ex's option of the same name; off by default here, so the default stays bit for "
        "bit with eager): replace subgraphs of the ATen graph with graphex's fused C++ CPU kernels (RMSNorm, "
        "add + RMSNorm, add + LayerNorm, SiLU-gated MLP, rotary embedding, one-token and prefill attention, one-row "
        "linear layers, chains of element-wise ops, conv nets in channels_last order; float32, bfloat16, "
        "float16) and with the patterns users "
        "register with graphex.register_replacement. Results are then within a stated tolerance per fused op "
        "(float32: abs(fused - eager) <= 1e-5 + 1e-5 * abs(eager); docs/fused-mode.md), not bitwise; "
        "GRAPHEX_LOG=1 says what fired.")

    channels_last_conv: bool = _option(
        True, (bool,),
        "In fused mode (pattern_fusion_pass=True), run 2-d convolutions and the ops between them (batch norm, "
        "activations, residual adds, pooling) in channels_last memory order, as oneDNN computes them: each "
        "activation entering the first convolution is copied into that order once, and any other reader gets it "
        "back contiguous (graphex/fusion/conv_layout.py). Within fused mode's tolerance, not bit for bit. No effect "
        "in exact mode.")

    prepack_conv_weights: bool = _option(
        True, (bool,),
        "In fused mode with frozen_parameter=True, a float32 2-d convolution in channels_last order (see "
        "channels_last_conv) whose weight is a frozen parameter larger than 1x1 reads that weight in oneDNN's "
        "own layout, reordered once when the program is lowered instead of on every call "
        "(graphex/lowering/prepack.py). The weight is then watched by contents: any write into it is seen on the "
        "next call and the program is re-lowered. Within fused mode's tolerance, not bit for bit. No effect in "
        "exact mode or without frozen_parameter.")

    pointwise_fusion: bool = _option(
        True, (bool,),
        "In fused mode (pattern_fusion_pass=True), also run each chain of element-wise ops of one shape (a tanh "
        "GELU written out, a bias add and its activation, a residual add and a ReLU) as one kernel of ours, "
        "after the patterns have fired (graphex/fusion/chains.py); an inference batch norm joins the chain around "
        "it as a per-channel multiply and add (graphex/fusion/batch_norm.py). No effect in exact mode.")

    post_grad_custom_pre_pass: Callable[..., Any] | None = _option(
        None, (type(None), Callable),  # type: ignore[arg-type]
        "A callable `fn(graph: torch.fx.Graph) -> None` run on the functional ATen graph "
        "before graphex's own passes.")

    post_grad_custom_post_pass: Callable[..., Any] | None = _option(
        None, (type(None), Callable),  # type: ignore[arg-type]
        "A callable `fn(graph: torch.fx.Graph) -> None` run after graphex's passes, just "
        "before the graph is lowered to the C++ program.")

    dump_dir: str | None = _option(
        None, (type(None), str, os.PathLike),
        "Directory to write, per captured graph, its readable code (graph_N.py) and the "
        "engine's plan (graph_N.plan.txt). Also set by the GRAPHEX_DUMP environment variable.", keyed=False)

    validate_fake: bool = _option(
        True, (bool,),
        "On the first replay, check each custom op's real outputs against what its "
        "fake/Meta function promised (shape, dtype, device) and raise a CustomOpError naming "
        "the op, both results and the fix. Done by the engine during that run: no extra run.")

    dump_tensor_data: bool = _option(
        False, (bool,),
        "Dump the graph inputs and every op's output of each replay (npugraph_ex's option of the same "
        "name), as data_dump_dir/graph_N/call_K/NNN_<node>.pt plus index.json. For per-op accuracy "
        "(`graphex triage` uses it). Off: no cost; on: every replay is slower and writes every "
        "intermediate tensor (see data_dump_calls).")

    data_dump_stage: str = _option(
        "optimized", (str,),
        "With dump_tensor_data: 'optimized' dumps the C++ engine's own values (after graphex's passes, "
        "as replayed); 'original' runs the functional ATen graph from before graphex's passes with "
        "torch.fx on clones of the inputs (eager kernels) and dumps its values; the replay itself "
        "still runs on the engine.", choices=("optimized", "original"))

    data_dump_dir: str | None = _option(
        None, (type(None), str, os.PathLike),
        "With dump_tensor_data: where the dumps go (default: ./graphex_data_dump).", keyed=False)

    data_dump_calls: int = _option(
        8, (int,),
        "With dump_tensor_data: how many replays of each graph are dumped (the first N); later "
        "replays run the plain engine. A dumped call writes the inputs plus every op's outputs, "
        "about the sum of all intermediate tensor sizes of the graph.", minimum=1)

    @staticmethod
    def from_user(options: dict[str, Any] | Options | None) -> Options:
        """Validate a user's options dict; unknown keys and bad values raise OptionsError (a ValueError)."""
        if isinstance(options, Options):
            return options
        options = dict(options or {})
        problem = _problem(options, _specs())
        if problem is not None:
            from .errors import OptionsError  # Note [A cache hit imports no compiler] (errors.py imports Dynamo)

            raise OptionsError(problem)
        if options.get("dump_dir") is None and os.environ.get("GRAPHEX_DUMP"):
            options["dump_dir"] = os.environ["GRAPHEX_DUMP"]
        for key in ("dump_dir", "data_dump_dir"):
            if options.get(key) is not None:
                options[key] = os.fspath(options[key])
        return Options(**options)

    def cache_key(self) -> dict[str, Any]:
        """The options that change the program made, as plain data for a cache key (callables by qualified name
        and source). The fusion patterns registered are keyed by the cache itself (graphex.inference)."""
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            if not f.metadata["spec"].keyed:
                continue
            value = getattr(self, f.name)
            out[f.name] = _callable_identity(value) if callable(value) else value
        return out


def _specs() -> dict[str, _Spec]:
    return {f.name: f.metadata["spec"] for f in dataclasses.fields(Options)}


def option_docs() -> list[tuple[str, Any, str]]:
    """(name, default, meaning) for every option, in declaration order."""
    return [(f.name, f.default, f.metadata["spec"].doc) for f in dataclasses.fields(Options)]


def _is_instance(value: Any, t: Any) -> bool:
    if t is Callable:
        return callable(value)
    return isinstance(value, t)


def _type_name(t: Any) -> str:
    if t is Callable:
        return "a callable"
    if t is type(None):
        return "None"
    return t.__name__


def _callable_identity(fn: Callable[..., Any]) -> str:
    import inspect

    name = f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"
    try:
        return name + "\n" + inspect.getsource(fn)
    except (OSError, TypeError):
        return name


def _problem(options: dict[str, Any], specs: dict[str, Any]) -> str | None:
    """What is wrong with a user's options dict (the OptionsError's message), or None."""
    unknown = sorted(set(options) - set(specs))
    if unknown:
        return (f"graphex: unknown option{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))}. "
                f"Valid options: {', '.join(sorted(specs))}. See `python -m graphex options` for what each does.")
    for key, value in options.items():
        spec = specs[key]
        ok = any(_is_instance(value, t) for t in spec.types)
        if spec.types == (bool,) and not isinstance(value, bool):
            ok = False
        if spec.types == (int,) and (isinstance(value, bool) or not isinstance(value, int)):
            ok = False
        if not ok:
            wanted = " or ".join(_type_name(t) for t in spec.types)
            return f"graphex: option {key!r} must be {wanted}, got {value!r}."
        if spec.minimum is not None and value < spec.minimum:
            return f"graphex: option {key!r} must be at least {spec.minimum}, got {value}."
        if spec.choices is not None and value not in spec.choices:
            return f"graphex: option {key!r} must be one of {', '.join(map(repr, spec.choices))}, got {value!r}."
    pool = options.get("use_graph_pool")
    if pool is not None and (len(pool) != 2 or not all(isinstance(p, int) for p in pool)):
        return (f"graphex: option 'use_graph_pool' must be a pool id, a pair of ints (e.g. "
                f"torch.cuda.graph_pool_handle()), got {pool!r}.")
    return None
