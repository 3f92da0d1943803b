"""The models behind the workloads users run (bench/cases.py): decoders and an encoder from the
`transformers` library built from a config with random weights (no downloads), a conv net, and
PyTorch's own attention blocks.

The transformers decoders run one step with a static KV cache (`transformers.StaticCache`) that
the step updates in place. `HFStep` wraps the model so a step is a pure function of its inputs
and the module's state, as in this repo's own decoder: `step(input_ids, position)` writes the
keys and values of `input_ids` at `position` onwards and returns the logits of the last token.
The cache's tensors are registered as (non-persistent) buffers of the wrapper, so every backend
sees them as module state: Dynamo as static inputs it mutates, `torch.jit.trace` as attributes.

transformers picks its attention code path with `is_torchdynamo_compiling()` (and
`is_torchdynamo_exporting()`, `is_jit_tracing()`): for grouped-query decode with a mask, eager
runs SDPA on the packed query (`pack_gqa`), torch.compile on repeated keys and values
(`repeat_kv`). `code_path(kind)` makes eager take the path a tracer takes, so a compiled
backend is compared with eager on the same code path (bench/run.py's reference run).
"""

from __future__ import annotations

import contextlib
import os
import sys
from typing import Any, Iterator

import torch
from torch import nn

# Every config is built locally; nothing may reach for the hub.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")


def have_transformers() -> str | None:
    """None when transformers imports; else why not (the reason a case is skipped)."""
    try:
        import transformers  # noqa: F401
    except ImportError as e:
        return f"transformers is not installed ({e}); `make bench` installs bench/requirements.txt"
    return None


def _quiet_transformers() -> None:
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()


# -- transformers decoders with a static KV cache ---------------------------------------------------
class HFStep(nn.Module):
    """One step of a transformers causal LM over a StaticCache of `max_cache_len` positions.

    forward(input_ids [1, T], position [] int64) -> logits of the last token [1, 1, vocab].
    The step sets the cache's length to `position` first (transformers' StaticLayer keeps it in a
    tensor that each update advances in place), so calling the same step again rewrites the same
    cache positions with the same values: repeated calls are identical, as the timing needs.
    """

    def __init__(self, model: nn.Module, max_cache_len: int, seed: int = 1) -> None:
        super().__init__()
        from transformers import StaticCache

        self.model = model
        cfg = model.config
        self.cache = StaticCache(config=cfg, max_cache_len=max_cache_len)
        heads = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
        self.cache.early_initialization(batch_size=1, num_heads=heads, head_dim=cfg.hidden_size // cfg.num_attention_heads,
                                        dtype=torch.float32, device=torch.device("cpu"))
        g = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for i, layer in enumerate(self.cache.layers):
                # Earlier tokens' keys and values: random, so the attention sees real numbers, not zeros.
                layer.keys.copy_(torch.randn(layer.keys.shape, generator=g))
                layer.values.copy_(torch.randn(layer.values.shape, generator=g))
                self.register_buffer(f"cache_keys_{i}", layer.keys, persistent=False)
                self.register_buffer(f"cache_values_{i}", layer.values, persistent=False)
                self.register_buffer(f"cache_length_{i}", layer.cumulative_length, persistent=False)

    def forward(self, input_ids: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
        for layer in self.cache.layers:
            layer.cumulative_length.copy_(position)
        return self.model(input_ids=input_ids, cache=self.cache, use_cache=True, logits_to_keep=1).logits

    def state(self) -> list[torch.Tensor]:
        """The cache tensors, in the order ExplicitCacheStep takes and returns them."""
        return [t for layer in self.cache.layers for t in (layer.keys, layer.values)]


# -- nine transformers families, from configs ---------------------------------------------------------
HF_FAMILIES = ("llama", "qwen2", "mistral", "phi3", "gemma2", "gpt2", "gpt_neox", "falcon", "bloom")

# "coverage": make fusion-coverage's size (seconds per family on 2 cores); "bench": bench.families' size.
FAMILY_SIZE = {"coverage": dict(vocab=128, hidden=64, layers=2, heads=4, intermediate=128, positions=64),
               "bench": dict(vocab=4096, hidden=256, layers=4, heads=4, intermediate=1024, positions=512)}


def hf_family(arch: str, size: str = "bench", dtype: torch.dtype = torch.float32) -> nn.Module:
    """A causal LM of one of HF_FAMILIES from its config, random weights, in `dtype`, eval mode. Grouped-query
    families get 2 key/value heads; Mistral full attention (7B v0.2 on); Falcon the multi-query layout of 7B;
    families without an SDPA path in transformers (Gemma2, Bloom) their own attention."""
    import transformers as tf

    _quiet_transformers()
    z = FAMILY_SIZE[size]
    torch.manual_seed(0)
    small = dict(vocab_size=z["vocab"], hidden_size=z["hidden"], num_hidden_layers=z["layers"],
                 num_attention_heads=z["heads"])
    if arch in ("llama", "qwen2", "mistral", "phi3", "gemma2"):
        cfg_cls = {"llama": tf.LlamaConfig, "qwen2": tf.Qwen2Config, "mistral": tf.MistralConfig,
                   "phi3": tf.Phi3Config, "gemma2": tf.Gemma2Config}[arch]
        extra: dict[str, Any] = dict(intermediate_size=z["intermediate"], num_key_value_heads=2,
                                     max_position_embeddings=z["positions"])
        if arch == "mistral":
            extra.update(sliding_window=None)  # Mistral 7B v0.2 and later: full attention
        if arch == "gemma2":
            extra.update(head_dim=z["hidden"] // z["heads"], sliding_window=z["positions"] // 2)
        if arch == "phi3":
            extra.update(pad_token_id=0)
        cfg = cfg_cls(**small, **extra)
    elif arch == "gpt2":
        cfg = tf.GPT2Config(vocab_size=z["vocab"], n_embd=z["hidden"], n_layer=z["layers"], n_head=z["heads"],
                            n_positions=z["positions"])
    elif arch == "gpt_neox":
        cfg = tf.GPTNeoXConfig(**small, intermediate_size=z["intermediate"], max_position_embeddings=z["positions"])
    elif arch == "falcon":
        cfg = tf.FalconConfig(**small, new_decoder_architecture=False, multi_query=True)
    elif arch == "bloom":
        cfg = tf.BloomConfig(vocab_size=z["vocab"], hidden_size=z["hidden"], n_layer=z["layers"], n_head=z["heads"])
    else:
        raise ValueError(f"unknown family {arch!r}; one of {', '.join(HF_FAMILIES)}")
    try:
        model = tf.AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa")
    except ValueError:  # transformers has no SDPA path for this architecture (Gemma2, Bloom): its own attention
        model = tf.AutoModelForCausalLM.from_config(cfg, attn_implementation="eager")
    return model.to(dtype).eval()


class FamilyStep(nn.Module):
    """One decode step of any transformers causal LM over a StaticCache, like HFStep without knowing the family's
    cache layout: an eager 8-token prefill creates the cache's tensors, which are then filled with random keys
    and values and registered as buffers. forward(input_ids [1, 1], position []) sets every layer's length to
    `position` and returns the last token's logits, so repeated calls rewrite the same slot. A sliding-window
    layer (Gemma2's) counts its length in a Python int, which Dynamo specializes on: it is set to `position`
    given here, so the step must be called at that position."""

    def __init__(self, model: nn.Module, max_cache_len: int, position: int, seed: int = 1) -> None:
        super().__init__()
        from transformers import StaticCache

        self.model = model
        self.position = position
        self.cache = StaticCache(config=model.config, max_cache_len=max_cache_len)
        g = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            model(input_ids=torch.arange(8).view(1, 8) + 3, cache=self.cache, use_cache=True)
            for i, layer in enumerate(self.cache.layers):
                for name in ("keys", "values"):
                    t = getattr(layer, name)
                    t.copy_(torch.randn(t.shape, generator=g).to(t.dtype))
                    self.register_buffer(f"cache_{name}_{i}", t, persistent=False)

    def forward(self, input_ids: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
        for layer in self.cache.layers:
            if isinstance(layer.cumulative_length, torch.Tensor):
                layer.cumulative_length.copy_(position)
            if hasattr(layer, "cumulative_length_int"):
                layer.cumulative_length_int = self.position
        return self.model(input_ids=input_ids, cache=self.cache, use_cache=True, logits_to_keep=1).logits


class ExplicitCacheStep(nn.Module):
    """HFStep with the cache as explicit inputs and outputs, for exporters without in-place inputs (ONNX).

    forward(input_ids, position, *caches) -> (logits, *updated caches). The given caches are not
    written: each is copied and the copy updated, so the new cache is an output (what an ONNX
    Runtime user feeds into the next step).
    """

    def __init__(self, step: HFStep) -> None:
        super().__init__()
        self.step = step

    def forward(self, input_ids: torch.Tensor, position: torch.Tensor, *caches: torch.Tensor) -> tuple[torch.Tensor, ...]:
        for i, layer in enumerate(self.step.cache.layers):
            layer.keys = caches[2 * i].clone()
            layer.values = caches[2 * i + 1].clone()
            layer.cumulative_length = position.clone()
        logits = self.step.model(input_ids=input_ids, cache=self.step.cache, use_cache=True, logits_to_keep=1).logits
        return (logits, *[t for layer in self.step.cache.layers for t in (layer.keys, layer.values)])


def explicit_cache(step: HFStep, args: tuple[Any, ...]) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """The ONNX adapter of an HFStep (Case.onnx_adapter): a fresh copy of the step with the cache as I/O,
    and the extra inputs (the current cache) to feed it after `args`."""
    import copy

    clone = copy.deepcopy(step)
    return ExplicitCacheStep(clone).eval(), tuple(t.clone() for t in step.state())


@contextlib.contextmanager
def code_path(kind: str) -> Iterator[None]:
    """Make transformers, run eagerly, take the code path it takes under a tracer.

    kind: "dynamo" (torch.compile: is_torchdynamo_compiling() is True), "export" (torch.export and
    torch.onnx.export(dynamo=True): compiling and exporting), "jit" (torch.jit.trace: is_jit_tracing()).
    Only transformers' own predicates are replaced (in every transformers module that imported them),
    for the duration of the block; torch's are untouched, so PyTorch's kernels are the eager ones.
    """
    import transformers.utils.import_utils as iu

    wanted = {"dynamo": ("is_torchdynamo_compiling",), "export": ("is_torchdynamo_compiling", "is_torchdynamo_exporting"),
              "jit": ("is_jit_tracing",)}[kind]
    saved: list[tuple[Any, str, Any]] = []
    for name in wanted:
        original = getattr(iu, name)
        for mod_name, mod in list(sys.modules.items()):
            if (mod_name == "transformers" or mod_name.startswith("transformers.")) and getattr(mod, name, None) is original:
                saved.append((mod, name, original))
                setattr(mod, name, lambda: True)
    try:
        yield
    finally:
        for mod, name, original in saved:
            setattr(mod, name, original)


# Sizes: "bench" for make bench, "tiny" for the tests (seconds on 2 cores).
LLAMA = {"bench": dict(vocab_size=4096, hidden_size=512, intermediate_size=1376, num_hidden_layers=4,
                       num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=1024),
         "tiny": dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)}
GPT2 = {"bench": dict(vocab_size=4096, n_embd=512, n_layer=4, n_head=8, n_positions=1024),
        "tiny": dict(vocab_size=256, n_embd=64, n_layer=2, n_head=4, n_positions=128)}
BERT = {"bench": dict(vocab_size=4096, hidden_size=256, num_hidden_layers=4, num_attention_heads=4,
                      intermediate_size=1024, max_position_embeddings=512),
        "tiny": dict(vocab_size=256, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                     intermediate_size=128, max_position_embeddings=128)}
CACHE_LEN = {"bench": 256, "tiny": 32}


def build_hf_decoder(arch: str, size: str = "bench") -> HFStep:
    """A Llama-style (grouped-query attention, RMSNorm, rotary, SiLU MLP) or GPT-2-style decoder, random weights."""
    _quiet_transformers()
    torch.manual_seed(0)
    if arch == "llama":
        from transformers import LlamaConfig, LlamaForCausalLM

        model = LlamaForCausalLM(LlamaConfig(**LLAMA[size], attn_implementation="sdpa"))
    elif arch == "gpt2":
        from transformers import GPT2Config, GPT2LMHeadModel

        model = GPT2LMHeadModel(GPT2Config(**GPT2[size], attn_implementation="sdpa"))
    else:
        raise ValueError(arch)
    return HFStep(model.eval(), CACHE_LEN[size]).eval()


def hf_step_inputs(tokens: int, position: int, vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    ids = (torch.arange(tokens, dtype=torch.long) * 7 + 3).remainder(vocab).view(1, tokens)
    return ids, torch.tensor(position, dtype=torch.long)


class BertEncoder(nn.Module):
    """transformers' BertModel (no attention mask: every token attends to every token)."""

    def __init__(self, size: str = "bench") -> None:
        super().__init__()
        _quiet_transformers()
        from transformers import BertConfig, BertModel

        torch.manual_seed(0)
        self.bert = BertModel(BertConfig(**BERT[size], attn_implementation="sdpa")).eval()

    def forward(self, input_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out = self.bert(input_ids=input_ids)
        return out.last_hidden_state, out.pooler_output


# -- a conv net ------------------------------------------------------------------------------------
class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut = (nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
                         if stride != 1 or cin != cout else nn.Identity())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(y)) + self.shortcut(x))


class ConvNet(nn.Module):
    """A small ResNet: conv-bn-relu stem, max pool, basic blocks at 32/64/128 channels, average pool, linear."""

    def __init__(self, width: int = 32, classes: int = 10) -> None:
        super().__init__()
        w = width
        self.stem = nn.Sequential(nn.Conv2d(3, w, 3, 1, 1, bias=False), nn.BatchNorm2d(w), nn.ReLU(), nn.MaxPool2d(2))
        self.blocks = nn.Sequential(BasicBlock(w, w, 1), BasicBlock(w, w, 1), BasicBlock(w, 2 * w, 2),
                                    BasicBlock(2 * w, 2 * w, 1), BasicBlock(2 * w, 4 * w, 2))
        self.head = nn.Linear(4 * w, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.blocks(self.stem(x))
        return self.head(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1))


def build_convnet(width: int = 32) -> ConvNet:
    torch.manual_seed(0)
    net = ConvNet(width)
    g = torch.Generator().manual_seed(2)
    with torch.no_grad():  # trained-looking batch-norm statistics, not the identity
        for m in net.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.copy_(torch.randn(m.num_features, generator=g) * 0.1)
                m.running_var.copy_(torch.rand(m.num_features, generator=g) + 0.5)
                m.weight.copy_(torch.rand(m.num_features, generator=g) + 0.5)
                m.bias.copy_(torch.randn(m.num_features, generator=g) * 0.1)
    return net.eval()


# -- PyTorch's attention blocks (eval + no_grad: eager runs their fused fast paths) ----------------------
class MHABlock(nn.Module):
    """nn.MultiheadAttention, self-attention, batch_first; eager runs torch._native_multi_head_attention."""

    def __init__(self, dim: int = 256, heads: int = 8) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.attn = nn.MultiheadAttention(dim, heads, batch_first=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.attn(x, x, x, need_weights=False)[0]


def build_transformer_encoder(dim: int = 256, heads: int = 8, ffn: int = 1024, layers: int = 2) -> nn.Module:
    """nn.TransformerEncoder, batch_first; eager runs torch._transformer_encoder_layer_fwd per layer."""
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(dim, heads, ffn, dropout=0.0, batch_first=True)
    return nn.TransformerEncoder(layer, layers, enable_nested_tensor=False).eval()
