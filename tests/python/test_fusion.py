"""Fused mode end to end: option pattern_fusion_pass, the built-in patterns on real models,
graphex.register_replacement with a user's custom op, GRAPHEX_LOG=1, and graphex-run.

Tolerance of a whole model (docs/fused-mode.md, "How close to eager"): greedy tokens identical to eager
and logits within abs(fused - eager) <= 1e-4 + 1e-4 * abs(eager); each fused op is within
1e-5 + 1e-5 * abs(eager) (tests/python/test_fused_kernels.py).
"""

from __future__ import annotations

import collections
import os
import subprocess
import sys

import pytest
import torch

import graphex
from graphex.exporting import load_safetensors, safetensors_bytes

from conftest import ROOT, captures, fused_ops, newest_capture, require

from examples.models.decoder import DecoderConfig, build_decoder, decode
from sweeps.fusion_coverage import MODEL_TOL as MODEL_TOL_PER_DTYPE  # fused mode's model tolerance, defined once

MODEL_TOL = dict(atol=MODEL_TOL_PER_DTYPE[torch.float32], rtol=MODEL_TOL_PER_DTYPE[torch.float32])
FUSED = {"pattern_fusion_pass": True}


def compile_decoder(model, **options):
    return torch.compile(model, backend="graphex", fullgraph=True, dynamic=False, options=options)


def test_decoder_fuses_and_decodes_the_same_tokens(capsys, monkeypatch):
    monkeypatch.setenv("GRAPHEX_LOG", "1")
    alive = {id(g) for g in captures()}  # another file's test may leave a graph alive in this worker
    model = build_decoder()
    compiled = compile_decoder(model, **FUSED)
    with torch.no_grad():
        got = decode(compiled, 32)
        want = decode(model, 32)
    (graph,) = [g for g in captures() if id(g) not in alive]  # the one graph this compile made
    layers = model.cfg.layers
    want_fused = {"add_rms_norm": 2 * layers, "rms_norm": 1, "rotary": 2 * layers, "gated_mlp": layers,
                  "decode_attention": layers, "matvec": 4 * layers + 1}  # q, k, v, o and the lm_head: one row
    assert fused_ops(graph.gm) == want_fused  # the graph holds them
    assert graph.fused == want_fused  # and the pass counted them, on the compiled graph
    for step, (g, w) in enumerate(zip(got, want)):
        assert torch.equal(g.argmax(-1), w.argmax(-1)), f"step {step}: greedy token differs"
        torch.testing.assert_close(g, w, **MODEL_TOL, msg=lambda m: f"step {step}: {m}")
    err = capsys.readouterr().err  # GRAPHEX_LOG=1 says the same, for a user
    assert f"{graph.name}: pattern fusion: " + ", ".join(f"{n} x{c}" for n, c in sorted(want_fused.items())) in err


def test_option_off_leaves_the_graph_exact():
    model = build_decoder(DecoderConfig(layers=1))
    compiled = compile_decoder(model)
    k, v = model.new_cache()
    k2, v2 = model.new_cache()
    args = (torch.tensor([[5]]), torch.tensor([0]))
    with torch.no_grad():
        out = compiled(*args, k, v)
        expected = model(*args, k2, v2)
    (graph,) = captures()
    assert not fused_ops(graph.gm) and graph.fused == {}
    assert torch.equal(out, expected) and torch.equal(k, k2) and torch.equal(v, v2)


def test_float64_model_is_left_exact():
    """The patterns admit float32 only: a float64 model compiles in fused mode with no fused op, bitwise."""
    model = build_decoder(DecoderConfig(layers=1)).double()
    compiled = compile_decoder(model, **FUSED)
    k, v = model.new_cache(dtype=torch.float64)
    args = (torch.tensor([[5]]), torch.tensor([0]))
    with torch.no_grad():
        out = compiled(*args, k.clone(), v.clone())
        expected = model(*args, k.clone(), v.clone())
    (graph,) = captures()
    assert not fused_ops(graph.gm) and graph.fused == {}
    assert torch.equal(out, expected)


def test_fused_graph_keeps_node_meta():
    model = build_decoder(DecoderConfig(layers=1))
    compiled = compile_decoder(model, **FUSED)
    k, v = model.new_cache()
    with torch.no_grad():
        compiled(torch.tensor([[5]]), torch.tensor([0]), k, v)
    (graph,) = captures()
    nodes = [n for n in graph.gm.graph.nodes if getattr(n.target, "namespace", "") == "graphex_fused"]
    assert nodes
    for n in nodes:
        assert "val" in n.meta, n
        assert "decoder.py" in n.meta.get("stack_trace", ""), n  # the user's source line, for errors and dumps


# ---- users' patterns -------------------------------------------------------------------------------

CALLS = collections.Counter()


@torch.library.custom_op("graphex_test_fusion::tanh_mul", mutates_args=())
def tanh_mul(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    CALLS["tanh_mul"] += 1
    return torch.tanh(x) * y


@tanh_mul.register_fake
def _(x, y):
    return torch.empty_like(x)


def _tanh_mul_search(x, y):
    return torch.tanh(x) * y


def _tanh_mul_replace(x, y):
    return torch.ops.graphex_test_fusion.tanh_mul(x, y)


@pytest.fixture(scope="module")
def user_pattern():
    graphex.register_replacement(_tanh_mul_search, _tanh_mul_replace, [torch.randn(4, 4), torch.randn(4, 4)],
                                 extra_check=lambda m: m.kwargs["x"].meta["val"].shape[-1] != 3)
    # Registering it again is a duplicate: skipped when asked to, as in npugraph_ex.
    assert graphex.register_replacement(_tanh_mul_search, _tanh_mul_replace, [torch.randn(4, 4), torch.randn(4, 4)],
                                        skip_duplicates=True) is False


def test_user_pattern_calls_the_users_custom_op(user_pattern, capsys, monkeypatch):
    monkeypatch.setenv("GRAPHEX_LOG", "1")

    def f(a, b):
        return torch.tanh(a) * b + 1

    a, b = torch.randn(2, 8), torch.randn(2, 8)
    compiled = torch.compile(f, backend="graphex", fullgraph=True, dynamic=False, options=FUSED)
    before = CALLS["tanh_mul"]
    out = compiled(a, b)
    out = compiled(a, b)
    (graph,) = captures()
    assert any(n.target is torch.ops.graphex_test_fusion.tanh_mul.default for n in graph.gm.graph.nodes)
    assert CALLS["tanh_mul"] - before == 2  # the engine runs the user's kernel on each call
    torch.testing.assert_close(out, f(a, b), atol=0, rtol=0)
    assert graph.fused == {"_tanh_mul_search": 1}
    assert "pattern fusion: _tanh_mul_search x1" in capsys.readouterr().err


def test_user_pattern_needs_the_option_and_passes_its_extra_check(user_pattern):
    def f(a, b):
        return torch.tanh(a) * b

    for options, x in (({}, torch.randn(2, 8)), (FUSED, torch.randn(2, 3))):  # option off; extra_check says no
        torch._dynamo.reset()
        before = CALLS["tanh_mul"]
        torch.compile(f, backend="graphex", fullgraph=True, dynamic=False, options=options)(x, x)
        assert CALLS["tanh_mul"] == before
        assert not any(n.target is torch.ops.graphex_test_fusion.tanh_mul.default for n in newest_capture().gm.graph.nodes)


def test_npugraph_ex_path():
    import graphex.npugraph_ex

    assert graphex.npugraph_ex.register_replacement is graphex.register_replacement


# ---- graphex-run: the fused ops are linked into the Python-free runner ---------------------------------

GRAPHEX_RUN = os.path.join(os.environ.get("GRAPHEX_BUILD_DIR") or os.path.join(ROOT, "build", "py"), "graphex-run")


def test_graphex_run_runs_a_fused_program(tmp_path):
    assert os.path.exists(GRAPHEX_RUN), "graphex-run is not built: make build"
    model = build_decoder(DecoderConfig(layers=1))
    k, v = model.new_cache()
    args = (torch.tensor([[7]]), torch.tensor([0]), k, v)
    path = graphex.export(model, args, tmp_path / "fused.graphex", options=FUSED)
    assert "graphex_fused" in open(os.path.join(path, "program.gxp"), "rb").read().decode("latin-1")
    (tmp_path / "in.safetensors").write_bytes(safetensors_bytes({str(i): a for i, a in enumerate(args)}))
    proc = subprocess.run([GRAPHEX_RUN, path, "--inputs", str(tmp_path / "in.safetensors"),
                           "--output", str(tmp_path / "out.safetensors")], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    with torch.no_grad():
        expected = model(*[a.clone() for a in args])
    torch.testing.assert_close(load_safetensors(tmp_path / "out.safetensors")["0"], expected, **MODEL_TOL)


class _PrefillBlock(torch.nn.Module):
    """A grouped-query prefill: SDPA after repeat_kv (prefill_attention), then the residual add and a LayerNorm
    (add_layer_norm)."""

    def __init__(self, d: int = 32, heads: int = 4, kv_heads: int = 2):
        super().__init__()
        self.heads, self.kv_heads = heads, kv_heads
        self.q = torch.nn.Linear(d, d)
        self.kv = torch.nn.Linear(d, 2 * d * kv_heads // heads)
        self.ln = torch.nn.LayerNorm(d)

    def forward(self, x):
        b, t, d = x.shape
        hd = d // self.heads
        q = self.q(x).view(b, t, self.heads, hd).transpose(1, 2)
        k, v = (z.view(b, t, self.kv_heads, hd).transpose(1, 2) for z in self.kv(x).chunk(2, dim=-1))
        n = self.heads // self.kv_heads
        k, v = (z[:, :, None].expand(b, self.kv_heads, n, t, hd).reshape(b, self.heads, t, hd) for z in (k, v))
        a = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        h = a.transpose(1, 2).reshape(b, t, d) + x
        return self.ln(h), h


def test_graphex_run_runs_a_fused_prefill(tmp_path):
    """prefill_attention (ATen's tiled kernel, called from our op) and add_layer_norm in a program graphex-run runs
    with no Python: the same result as the Python engine's, bit for bit, and eager's within the model tolerance."""
    assert os.path.exists(GRAPHEX_RUN), "graphex-run is not built: make build"
    torch.manual_seed(0)
    model = _PrefillBlock().eval()
    args = (torch.randn(2, 6, 32),)
    path = graphex.export(model, args, tmp_path / "prefill.graphex", options=FUSED)
    program = open(os.path.join(path, "program.gxp"), "rb").read().decode("latin-1")
    assert "prefill_attention" in program and "add_layer_norm" in program
    (tmp_path / "in.safetensors").write_bytes(safetensors_bytes({"0": args[0]}))
    proc = subprocess.run([GRAPHEX_RUN, path, "--inputs", str(tmp_path / "in.safetensors"),
                           "--output", str(tmp_path / "out.safetensors")], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    got = load_safetensors(tmp_path / "out.safetensors")
    torch._dynamo.reset()
    with torch.no_grad():
        in_python = torch.compile(model, backend="graphex", fullgraph=True, dynamic=False, options=FUSED)(*args)
        expected = model(*args)
    for i in range(2):
        assert torch.equal(got[str(i)], in_python[i])
        torch.testing.assert_close(got[str(i)], expected[i], **MODEL_TOL)


# ---- transformers' Llama --------------------------------------------------------------------------------

def test_transformers_llama_fuses():
    transformers = require("transformers")
    cfg = transformers.LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=172, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg).eval()
    ids = torch.randint(0, 256, (1, 8))

    def logits(input_ids):
        return model(input_ids=input_ids, use_cache=False).logits

    compiled = torch.compile(logits, backend="graphex", fullgraph=True, dynamic=False, options=FUSED)
    with torch.no_grad():
        got, want = compiled(ids), logits(ids)
    counts = collections.Counter()
    for g in captures():
        counts.update(fused_ops(g.gm))
    layers = cfg.num_hidden_layers
    assert counts["rotary"] == 2 * layers and counts["gated_mlp"] == layers
    assert counts["rms_norm"] + counts["add_rms_norm"] == 2 * layers + 1
    assert counts["prefill_attention"] == layers  # 8 query rows: repeat_kv + SDPA without the copy
    torch.testing.assert_close(got, want, **MODEL_TOL)
    assert torch.equal(got.argmax(-1), want.argmax(-1))


@pytest.mark.filterwarnings("ignore::FutureWarning")  # past_key_values renamed in newer transformers
def test_transformers_llama_gqa_decode_with_a_static_cache():
    """One-token steps over a StaticCache: repeat_kv + SDPA becomes one decode_attention per layer (no copy of
    the repeated cache). Eager runs its own attention path (Note in issue 8: transformers picks another SDPA
    path under torch.compile for GQA); both are compared within the model tolerance."""
    transformers = require("transformers")
    cfg = transformers.LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=172, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg).eval()
    caches = {name: transformers.StaticCache(config=cfg, max_cache_len=16) for name in ("eager", "fused")}

    def step(cache):
        def run(tok, pos):
            return model(input_ids=tok, past_key_values=cache, cache_position=pos, use_cache=True).logits
        return run

    eager = step(caches["eager"])
    compiled = torch.compile(step(caches["fused"]), backend="graphex", fullgraph=True, dynamic=False, options=FUSED)
    tok_e = tok_f = torch.tensor([[5]])
    with torch.no_grad():
        for i in range(8):
            pos = torch.tensor([i])
            got, want = compiled(tok_f, pos), eager(tok_e, pos)
            torch.testing.assert_close(got, want, **MODEL_TOL, msg=lambda m: f"step {i}: {m}")
            tok_f, tok_e = got[:, -1:].argmax(-1), want[:, -1:].argmax(-1)
            assert torch.equal(tok_f, tok_e), f"step {i}: greedy token differs"
    counts = fused_ops(newest_capture().gm)
    assert counts["decode_attention"] == cfg.num_hidden_layers
    assert not any(n.target is torch.ops.aten.clone.default for n in newest_capture().gm.graph.nodes)


def test_docs_register_replacement_example_runs():
    """docs/fused-mode.md "Your own patterns": its register_replacement example runs as written and its pattern
    fires (own process: its pattern would be a duplicate of this file's). test_docs.py runs the page's fences
    too, but does not look at what GRAPHEX_LOG prints."""
    page = open(os.path.join(ROOT, "docs", "fused-mode.md"), encoding="utf-8").read()
    section = page[page.index("## Your own patterns"):]
    code = section[section.index("```python\n") + len("```python\n"):section.index("\n```\n")]
    assert "graphex.register_replacement(" in code
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT,
                          env={**os.environ, "GRAPHEX_LOG": "1"})
    assert proc.returncode == 0, proc.stderr
    assert "pattern fusion: search x1" in proc.stderr


def test_symbolic_sizes_are_left_exact():
    """dynamic=True: a graph with symbolic sizes is left exact (the patterns' checks compare sizes and would add
    guards the program does not check); one whose sizes all came out static is fused as usual."""
    model = build_decoder(DecoderConfig(layers=1))
    compiled = torch.compile(model, backend="graphex", fullgraph=True, dynamic=True, options=FUSED)
    with torch.no_grad():
        for batch in (1, 3, 4):
            k, v = model.new_cache(batch)
            k2, v2 = model.new_cache(batch)
            tokens = torch.full((batch, 1), 5)
            got, want = compiled(tokens, torch.tensor([0]), k, v), model(tokens, torch.tensor([0]), k2, v2)
            torch.testing.assert_close(got, want, **MODEL_TOL)
    symbolic = [g for g in captures() if g.dynamic]
    assert symbolic and all(not fused_ops(g.gm) for g in symbolic)
    assert all(torch.equal(a, b) for a, b in zip(got, want))  # batch 4 ran the symbolic (exact) graph


@torch.library.custom_op("graphex_test_fusion::sigmoid_mul", mutates_args=())
def sigmoid_mul(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return (torch.sigmoid(x) * y).contiguous()


@sigmoid_mul.register_fake
def _(x, y):
    return torch.empty(x.shape, dtype=x.dtype)  # contiguous, whatever x's layout


def test_a_replacement_that_changes_the_layout_is_declined(capsys, monkeypatch):
    """Note [A replacement keeps the layout]: eager's sigmoid(x) * y of transposed inputs is transposed;
    a replacement returning contiguous memory is not applied there (later views were traced with eager's
    strides), and GRAPHEX_LOG=2 says why. On contiguous inputs the same pattern applies."""
    # Patterns stay registered for the process: this one fires on this test's shapes only, so that a later test's
    # `sigmoid(x) * y` (test_pointwise_chains.py's sigmoid_gate, when both files share a process) keeps its own path
    graphex.register_replacement(lambda x, y: torch.sigmoid(x) * y,
                                 lambda x, y: torch.ops.graphex_test_fusion.sigmoid_mul(x, y),
                                 [torch.randn(4, 4), torch.randn(4, 4)],
                                 extra_check=lambda m: tuple(m.kwargs["x"].meta["val"].shape) in ((6, 4), (4, 6)))
    monkeypatch.setenv("GRAPHEX_LOG", "2")

    def f(a, b):
        return torch.sigmoid(a) * b

    a, b = torch.randn(6, 4), torch.randn(6, 4)
    for x, y, fused_expected in ((a.t(), b.t(), False), (a, b, True)):
        torch._dynamo.reset()
        out = torch.compile(f, backend="graphex", fullgraph=True, dynamic=False, options=FUSED)(x, y)
        torch.testing.assert_close(out, f(x, y), atol=0, rtol=0)
        fused_here = any(n.target is torch.ops.graphex_test_fusion.sigmoid_mul.default
                         for n in newest_capture().gm.graph.nodes)
        assert fused_here == fused_expected
    assert "differ from the graph's" in capsys.readouterr().err


def test_a_match_its_own_check_declines_is_logged(capsys, monkeypatch):
    """GRAPHEX_LOG=2 names a pattern whose own check declined a match (a helper found these silent): a float16 RMSNorm
    written without the float32 upcast keeps eager's kernels (eager squares in float16) and the log says so."""
    monkeypatch.setenv("GRAPHEX_LOG", "2")

    def rms(x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w

    x, w = torch.randn(2, 16).half(), torch.randn(16).half()
    torch._dynamo.reset()
    out = torch.compile(rms, backend="graphex", fullgraph=True, dynamic=False, options=FUSED)(x, w)
    assert "rms_norm" not in newest_capture().fused
    torch.testing.assert_close(out, rms(x, w), atol=1e-3, rtol=1e-3)
    assert "pattern fusion: rms_norm not applied at" in capsys.readouterr().err


@pytest.mark.parametrize("how", ["frozen_parameter", "cache_compile"])
def test_fused_mode_with_frozen_parameters_and_cache_compile(how, tmp_path):
    model = build_decoder(DecoderConfig(layers=2))
    if how == "frozen_parameter":
        step = compile_decoder(model, frozen_parameter=True, **FUSED)
    else:  # the guard-free path; the patterns registered are part of its cache key
        step = graphex.inference.cache_compile(model.forward, cache_dir=tmp_path, options=FUSED)
    with torch.no_grad():
        got = decode(step, 8, cache=model.new_cache())
        want = decode(model, 8)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, **MODEL_TOL)
        assert torch.equal(g.argmax(-1), w.argmax(-1))
    assert sum(fused_ops(g.gm)["gated_mlp"] for g in captures()) >= 2
    # A weight a fused op reads, updated in place, is seen (the fused ops read parameters on every call).
    with torch.no_grad():
        model.layers[0].mlp.down.weight.mul_(0.5)
        model.layers[1].mlp_norm.weight.add_(1.0)
        got = decode(step, 2, cache=model.new_cache())
        want = decode(model, 2)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, **MODEL_TOL)


def test_a_fused_compile_that_fused_nothing_says_so_once(monkeypatch):
    """Note [A fused compile that fused nothing says so]: float64 matches no built-in pattern; the user is told
    once per process, without GRAPHEX_LOG, and a compile where a kernel fired says nothing."""
    import warnings

    from graphex.base import warn as _warn

    monkeypatch.setattr(_warn, "_seen", set())
    model = build_decoder(DecoderConfig(layers=1))
    with warnings.catch_warnings(record=True) as fused_ok:
        warnings.simplefilter("always")
        k, v = model.new_cache()
        with torch.no_grad():
            compile_decoder(model, **FUSED)(torch.tensor([[5]]), torch.tensor([0]), k, v)
    assert not [w for w in fused_ok if "no fused kernel matched" in str(w.message)]

    def rms(x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w

    x, w = torch.randn(2, 16, dtype=torch.float64), torch.randn(16, dtype=torch.float64)
    with pytest.warns(graphex.GraphexWarning, match="no fused kernel matched in graph_.*runs exact"):
        out = compile_decoder(rms, **FUSED)(x, w)
    assert torch.equal(out, rms(x, w))
    with warnings.catch_warnings(record=True) as again:
        warnings.simplefilter("always")
        compile_decoder(lambda x, w: rms(x, w) + 1, **FUSED)(x, w)
    assert not [w for w in again if "no fused kernel matched" in str(w.message)], "warned twice"


def test_a_pattern_whose_check_raises_declines_the_match_and_says_so():
    """Note [A pattern that raises while checking declines the match] (graphex/compat/inductor.py): a user's pattern
    whose scalar argument its trace folds into a constant made torch's matcher raise "Not all inputs to pattern
    found", which failed the whole compile (found adding SDPA's math path). Now that match is declined, a
    GraphexWarning names the pattern once, and the result is eager's bit for bit. In a fresh interpreter: the
    pattern registry is process-wide."""
    code = """
import math, warnings, torch, graphex

def folded_scale(x, s):
    return torch.tanh(x) * math.sqrt(s)  # math.sqrt of the traced scalar: s never reaches the graph

def replace(x, s):
    return torch.zeros_like(x)  # wrong on purpose: it must never run

graphex.register_replacement(folded_scale, replace, [torch.randn(4, 4)], scalar_workaround={"s": 0.25})
f = lambda x: torch.tanh(x) * 0.5 + 1
x = torch.randn(8, 8)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    for _ in range(2):
        torch._dynamo.reset()
        out = torch.compile(f, backend="graphex", fullgraph=True, dynamic=False,
                            options={"pattern_fusion_pass": True, "pointwise_fusion": False})(x)
        assert torch.equal(out, f(x))
said = [str(w.message) for w in caught if "folded_scale" in str(w.message)]
assert len(said) == 1 and "declined" in said[0] and "Not all inputs" in said[0], said
print("ok")
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stderr[-3000:]
