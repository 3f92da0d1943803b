"""Note [Attention reads grouped key/value heads directly]: attention over a repeat_kv of the key/value heads reads
the grouped heads, bit for bit what the repeated copy gives, and near misses keep the copy."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from conftest import assert_same, captures, compile_graphex, require
from graphex.passes.aliasing import root

pytestmark = pytest.mark.default_isa  # run again under ATEN_CPU_CAPABILITY=default (make test-default-isa)

aten = torch.ops.aten
FLASH_CPU = aten._scaled_dot_product_flash_attention_for_cpu.default


def repeat_kv(x: torch.Tensor, n: int) -> torch.Tensor:
    """transformers' repeat_kv, as it is written there."""
    b, h, s, d = x.shape
    return x[:, :, None, :, :].expand(b, h, n, s, d).reshape(b, h * n, s, d)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("mask", [None, "broadcast", "per-head"])  # the op takes a float mask (SDPA converts bool)
@pytest.mark.parametrize("q_heads, kv_heads, q_len, kv_len, dim",
                         [(8, 2, 1, 256, 64), (8, 2, 7, 96, 64), (6, 3, 1, 33, 16), (4, 1, 130, 130, 32)])
def test_the_kernel_over_grouped_heads_equals_it_over_the_repeated_copy(q_heads, kv_heads, q_len, kv_len, dim, mask,
                                                                        dtype, threads):
    """The property the pass rests on, checked on the kernel itself (and again under ATEN_CPU_CAPABILITY=default)."""
    g = torch.Generator().manual_seed(q_heads * 1000 + kv_len)
    q = torch.randn(1, q_heads, q_len, dim, generator=g).to(dtype)
    k = torch.randn(1, kv_heads, kv_len, dim, generator=g).to(dtype)
    v = torch.randn(1, kv_heads, kv_len, dim, generator=g).to(dtype)
    heads = q_heads if mask == "per-head" else 1
    keep = torch.rand(1, heads, q_len, kv_len, generator=g) > 0.3
    attn_mask = None if mask is None else torch.zeros(keep.shape).masked_fill(~keep, float("-inf")).to(dtype)
    n = q_heads // kv_heads
    before = torch.get_num_threads()
    torch.set_num_threads(threads)

    def flash(keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor | None, str]:
        try:
            return FLASH_CPU(q, keys, values, attn_mask=attn_mask, scale=dim ** -0.5)[0], ""
        except RuntimeError as e:
            return None, str(e)

    try:
        repeated, repeated_error = flash(repeat_kv(k, n), repeat_kv(v, n))
        grouped, grouped_error = flash(k, v)
    finally:
        torch.set_num_threads(before)
    if repeated_error:
        # eager's own kernel fails on these inputs (torch 2.13's bf16 flash attention on a CPU with AVX-512 under
        # ATEN_CPU_CAPABILITY=default: "pack_vnni2 is only supported when avx512 is supported"): the grouped call,
        # what the pass hands the kernel, must fail the same way, never give a value eager's path does not
        assert grouped_error == repeated_error, (grouped_error, repeated_error)
        return
    assert not grouped_error, grouped_error
    assert_same(grouped, repeated)


class GQADecodeStep(torch.nn.Module):
    """One attention step over a KV cache held as buffers, GQA written the way transformers writes it compiled."""

    def __init__(self, q_heads=8, kv_heads=2, dim=16, cache_len=32, transposed_cache=False, write_between=False):
        super().__init__()
        self.q_heads, self.kv_heads, self.dim = q_heads, kv_heads, dim
        self.transposed_cache, self.write_between = transposed_cache, write_between
        shape = (1, kv_heads, dim, cache_len) if transposed_cache else (1, kv_heads, cache_len, dim)
        g = torch.Generator().manual_seed(0)
        self.register_buffer("k_cache", torch.randn(shape, generator=g))
        self.register_buffer("v_cache", torch.randn(1, kv_heads, cache_len, dim, generator=g))
        self.q = torch.nn.Linear(q_heads * dim, q_heads * dim)

    def forward(self, x, pos, k_new, v_new):
        q = self.q(x).view(1, 1, self.q_heads, self.dim).transpose(1, 2)
        if self.transposed_cache:
            self.k_cache.index_copy_(3, pos, k_new.transpose(2, 3))
            k = self.k_cache.transpose(2, 3)  # not contiguous: the copy would have had another layout
        else:
            self.k_cache.index_copy_(2, pos, k_new)
            k = self.k_cache
        self.v_cache.index_copy_(2, pos, v_new)
        n = self.q_heads // self.kv_heads
        keys, values = repeat_kv(k, n), repeat_kv(self.v_cache, n)
        if self.write_between:
            self.v_cache.mul_(0.5)  # after the copy: the attention must still see the values before it
        mask = (torch.arange(self.v_cache.shape[2]) <= pos).view(1, 1, 1, -1)
        return F.scaled_dot_product_attention(q, keys, values, attn_mask=mask)


def _run(model_kwargs, **options):
    """Three decode steps compiled and eager on copies of one model: outputs and caches bit for bit; the graph."""
    torch._dynamo.reset()
    ours, theirs = GQADecodeStep(**model_kwargs), GQADecodeStep(**model_kwargs)
    theirs.load_state_dict(ours.state_dict())
    compiled = compile_graphex(ours, **options)
    g = torch.Generator().manual_seed(1)
    before = {id(c) for c in captures()}
    with torch.no_grad():
        for step in range(3):
            args = (torch.randn(1, ours.q_heads * ours.dim, generator=g), torch.tensor([step + 3]),
                    torch.randn(1, ours.kv_heads, 1, ours.dim, generator=g),
                    torch.randn(1, ours.kv_heads, 1, ours.dim, generator=g))
            assert_same(compiled(*args), theirs(*args))
            assert_same(ours.k_cache, theirs.k_cache)
            assert_same(ours.v_cache, theirs.v_cache)
    (graph,) = [c for c in captures() if id(c) not in before] or captures()[-1:]
    return graph


def _attention_reads(graph):
    (attention,) = graph.gm.graph.find_nodes(op="call_function", target=FLASH_CPU)
    return attention.args[1], attention.args[2]


def _repeated(node):
    return node.target in (aten._unsafe_view.default, aten.view.default, aten.reshape.default)


def _clones(graph):
    return sum(1 for n in graph.gm.graph.nodes if n.target is aten.clone.default)


def test_a_gqa_decode_step_reads_the_cache_itself_bit_for_bit():
    graph = _run({})
    k, v = _attention_reads(graph)
    assert not _repeated(k) and not _repeated(v), (k, v)
    assert (root(k).op, root(v).op) == ("placeholder", "placeholder"), (k, v)  # the cache buffers themselves
    assert _clones(graph) == 0


def test_switched_off_the_repeated_copies_stay():
    graph = _run({}, grouped_kv_heads=False)
    assert _clones(graph) == 2


def test_a_cache_in_another_layout_keeps_its_copy():
    graph = _run({"transposed_cache": True})
    k, v = _attention_reads(graph)
    assert _repeated(k) and _repeated(v)  # both stay repeated: one alone is not rewritten
    assert _clones(graph) == 2


def test_a_cache_written_after_the_attention_read_stays_correct():
    """In the functional graph the later write makes a new value; reinplacing then sees the attention read the old
    one and keeps a copy of it (bit for bit against eager, checked in _run)."""
    graph = _run({"write_between": True})
    (kept,) = [k for k in graph.kept_copies if "v_cache" in k.what]
    assert (kept.node, kept.cause, kept.reader) == ("mul", "read-later", "_scaled_dot_product_flash_attention_for_cpu")


@pytest.mark.parametrize("write_between", [False, True])
def test_a_write_between_the_copy_and_the_attention_keeps_the_copy(write_between):
    """On a graph with an in-place write between the repeat and the attention (as a user's pre pass may leave
    one), the copy froze the values the attention reads: it must stay."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from graphex.passes.grouped_heads import read_grouped_heads_directly

    def f(q, k, v):
        keys, values = repeat_kv(k, 4), repeat_kv(v, 4)
        if write_between:
            k.mul_(2.0)
        return FLASH_CPU(q, keys, values, scale=0.25)[0]

    gm = make_fx(f, tracing_mode="fake")(torch.randn(1, 8, 1, 16), torch.randn(1, 2, 8, 16), torch.randn(1, 2, 8, 16))
    assert read_grouped_heads_directly(gm.graph) == (0 if write_between else 1)
def test_a_transformers_llama_step_matches_its_own_trace_run_by_torchs_kernels():
    """Llama from a config (GQA, StaticCache): graphex, with the copies gone, against aot_eager over the same trace
    (transformers' compiled path: repeat_kv), bit for bit, over three decode steps."""
    transformers = require("transformers")
    transformers.logging.set_verbosity_error()
    cfg = transformers.LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=64)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg).eval()

    def step(cache, ids, position):
        return model(input_ids=ids, past_key_values=cache, cache_position=position, use_cache=True).logits

    torch._dynamo.reset()
    caches = [transformers.StaticCache(config=cfg, max_cache_len=16) for _ in range(2)]
    ours = compile_graphex(step)
    reference = torch.compile(step, backend="aot_eager", fullgraph=True, dynamic=False)
    before = {id(c) for c in captures()}
    with torch.no_grad():
        for i, token in enumerate([5, 17, 42]):
            ids, position = torch.tensor([[token]]), torch.tensor([i])
            assert_same(ours(caches[0], ids, position), reference(caches[1], ids, position))
    graphs = [c for c in captures() if id(c) not in before]
    assert graphs and all(_clones(g) == 0 for g in graphs), [_clones(g) for g in graphs]
    assert all(len(g.gm.graph.find_nodes(op="call_function", target=FLASH_CPU)) == cfg.num_hidden_layers
               for g in graphs)
