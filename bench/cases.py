"""The workloads the benchmark measures: a list of `Case` objects.

To add a workload, write a `Case` (a name, what to compile, how to make its inputs)
and append it to `CASES`. Everything else (backends, timing, first call, memory,
the report) works on any case.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any, Callable, ContextManager

import torch


@dataclasses.dataclass(frozen=True)
class Handwritten:
    """A C++ binary that runs the same ATen calls as a case, by hand: the engine's lower bound.

    `args` make the binary run exactly the case's ops; `check()` is the value the binary
    prints as "check" when it is right (so a drifted mirror is caught, not timed).
    """

    binary: str
    args: tuple[str, ...]
    check: Callable[[], float]


@dataclasses.dataclass(frozen=True)
class Case:
    """One workload.

    build(): the module or function to compile (fresh, deterministic).
    inputs(built): the positional arguments of one step, for the object build() returned.
    ops: ATen ops in one step, when known (for per-op figures).
    unavailable(): None, or why the case cannot run here (a missing package): the case is skipped
      with that reason instead of failing.
    reference_path(kind): a context under which eager takes the code path that a tracer of `kind`
      ("dynamo", "export", "jit") takes, for models whose Python picks another path when traced
      (transformers); backends are compared with eager run on their own path.
    onnx_adapter(built, args): (module, extra inputs) for ONNX export when the step keeps state in
      place in its module (ONNX has no in-place inputs): the module takes (*args, *extra) and
      returns (*outputs, *new state). Without it, tensor inputs the step writes in place become
      explicit inputs and outputs automatically (bench/measure.py).
    """

    name: str
    description: str
    build: Callable[[], Callable[..., Any]]
    inputs: Callable[[Any], tuple[Any, ...]]
    ops: int | None = None
    handwritten: Handwritten | None = None
    unavailable: Callable[[], str | None] | None = None
    reference_path: Callable[[str], ContextManager[None]] | None = None
    onnx_adapter: Callable[[Any, tuple[Any, ...]], tuple[Any, tuple[Any, ...]]] | None = None

    def reference_context(self, kind: str | None) -> ContextManager[None]:
        """Where eager runs for a backend that traces with `kind` (None: eager's own path)."""
        if kind is None or self.reference_path is None:
            return contextlib.nullcontext()
        return self.reference_path(kind)


# -- the decoder decode step ----------------------------------------------------------
DECODE_POSITION = 7  # any position costs the same: the cache has a fixed length and a mask


def _build_decoder() -> torch.nn.Module:
    from examples.models.decoder import build_decoder

    return build_decoder()


def _decoder_inputs(model: Any) -> tuple[Any, ...]:
    k_cache, v_cache = model.new_cache()
    tokens = torch.ones((1, 1), dtype=torch.long)
    pos = torch.tensor([DECODE_POSITION])
    return tokens, pos, k_cache, v_cache


DECODER = Case(
    name="decoder_step",
    description="examples/models/decoder.py, default config: one decode step (batch 1, one token, "
                "4 layers, hidden 256, 4 heads, in-place KV cache of 256 positions)",
    build=_build_decoder,
    inputs=_decoder_inputs,
)


def _build_decoder_with_ops() -> torch.nn.Module:
    from examples.models.decoder import DecoderConfig, build_decoder

    return build_decoder(DecoderConfig(custom_ops=True))


DECODER_OPS = Case(
    name="decoder_ops_step",
    description="the same decoder with RMSNorm, rotary embeddings and the KV-cache update as C++ custom "
                "operators (examples/ops: TORCH_LIBRARY + Meta kernels); bit-identical to decoder_step",
    build=_build_decoder_with_ops,
    inputs=_decoder_inputs,
)


# -- the elementwise chain (mirrored by bench/handwritten_chain.cpp) ----------------------
CHAIN_OPS = 500
CHAIN_SIZE = 16
CHAIN_MUL = 1.0001
CHAIN_ADD = 0.5


def chain(x: torch.Tensor) -> torch.Tensor:
    """Op i (0-based): `x * CHAIN_MUL` when i is even, `x + CHAIN_ADD` when odd.

    The C++ mirror gets these constants on its command line (HANDWRITTEN_CHAIN.args).
    """
    for i in range(CHAIN_OPS):
        x = x * CHAIN_MUL if i % 2 == 0 else x + CHAIN_ADD
    return x


def _chain_check() -> float:
    with torch.no_grad():
        return float(chain(torch.ones(CHAIN_SIZE)).double().sum())


CHAIN = Case(
    name=f"chain{CHAIN_OPS}",
    description=f"{CHAIN_OPS} tiny elementwise ops (alternating x * {CHAIN_MUL} and x + {CHAIN_ADD}) "
                f"on a {CHAIN_SIZE}-element float32 tensor: the per-op cost of the engine",
    build=lambda: chain,
    inputs=lambda _fn: (torch.randn(CHAIN_SIZE, generator=torch.Generator().manual_seed(0)),),
    ops=CHAIN_OPS,
    handwritten=Handwritten(
        binary="graphex_handwritten_chain",
        args=("--ops", str(CHAIN_OPS), "--size", str(CHAIN_SIZE), "--mul", repr(CHAIN_MUL), "--add", repr(CHAIN_ADD)),
        check=_chain_check,
    ),
)

# -- workloads users run (bench/models.py) ---------------------------------------------------------
def _models() -> Any:
    from . import models

    return models


def _need_transformers() -> str | None:
    return _models().have_transformers()


def _code_path(kind: str) -> ContextManager[None]:
    return _models().code_path(kind)


def _explicit_cache(built: Any, args: tuple[Any, ...]) -> tuple[Any, tuple[Any, ...]]:
    return _models().explicit_cache(built, args)


HF_PATH_NOTE = ("; transformers picks its attention path with is_torchdynamo_compiling(), so each backend is "
                "compared with eager run on the path it traced (bench/models.py code_path)")


def hf_decoder_case(arch: str, tokens: int, size: str = "bench", name: str | None = None) -> Case:
    """A transformers decoder (arch "llama" or "gpt2"), random weights, one step of `tokens` tokens over a
    static KV cache: a decode step (tokens=1, at position 7) or a prefill (from position 0)."""
    position = 7 if tokens == 1 else 0
    shape = {"llama": "LlamaForCausalLM (hidden 512, 4 layers, 8 query / 2 key-value heads, vocab 4096)",
             "gpt2": "GPT2LMHeadModel (hidden 512, 4 layers, 8 heads, vocab 4096)"}[arch]
    what = "one-token decode step at position 7" if tokens == 1 else f"{tokens}-token prefill"
    return Case(
        name=name or f"{arch}_{'decode' if tokens == 1 else f'prefill{tokens}'}",
        description=f"transformers {shape if size == 'bench' else arch + ' (' + size + ')'}, random weights: {what} "
                    f"with a StaticCache of {_cache_len(size)} positions updated in place, logits of the last token"
                    + HF_PATH_NOTE,
        build=lambda: _models().build_hf_decoder(arch, size),
        inputs=lambda built: _models().hf_step_inputs(tokens, position, built.model.config.vocab_size),
        unavailable=_need_transformers,
        reference_path=_code_path,
        onnx_adapter=_explicit_cache,
    )


def _cache_len(size: str) -> int:
    return {"bench": 256, "tiny": 32}[size]


def bert_case(size: str = "bench", seq: int = 128, name: str = "bert_encoder") -> Case:
    def inputs(_built: Any) -> tuple[Any, ...]:
        vocab = _models().BERT[size]["vocab_size"]
        return ((torch.arange(seq, dtype=torch.long) * 13 + 5).remainder(vocab).view(1, seq),)

    return Case(
        name=name,
        description=f"transformers BertModel ({'hidden 256, 4 layers, 4 heads' if size == 'bench' else size}), random "
                    f"weights, one sequence of {seq} tokens, no mask: last hidden state and pooled output" + HF_PATH_NOTE,
        build=lambda: _models().BertEncoder(size).eval(),
        inputs=inputs,
        unavailable=_need_transformers,
        reference_path=_code_path,
    )


def convnet_case(width: int = 32, image: int = 64, name: str = "convnet") -> Case:
    return Case(
        name=name,
        description=f"a small ResNet, eval mode: conv-bn-relu stem and max pool, 5 basic blocks ({width}/{2 * width}/"
                    f"{4 * width} channels, conv / batchnorm / relu, 1x1 conv shortcuts), average pool, linear; "
                    f"one 1x3x{image}x{image} image",
        build=lambda: _models().build_convnet(width),
        inputs=lambda _b: (torch.randn(1, 3, image, image, generator=torch.Generator().manual_seed(3)),),
    )


def mha_case(dim: int = 256, heads: int = 8, seq: int = 64, name: str = "mha_block") -> Case:
    return Case(
        name=name,
        description=f"nn.MultiheadAttention({dim}, {heads}, batch_first=True), eval, self-attention on 1x{seq}x{dim}, "
                    "need_weights=False: eager runs its fused fast path (torch._native_multi_head_attention)",
        build=lambda: _models().MHABlock(dim, heads).eval(),
        inputs=lambda _b: (torch.randn(1, seq, dim, generator=torch.Generator().manual_seed(4)),),
    )


def transformer_encoder_case(dim: int = 256, heads: int = 8, ffn: int = 1024, layers: int = 2, seq: int = 64,
                             name: str = "transformer_encoder") -> Case:
    return Case(
        name=name,
        description=f"nn.TransformerEncoder, {layers} x TransformerEncoderLayer({dim}, {heads}, {ffn}, batch_first=True), "
                    f"eval, 1x{seq}x{dim}: eager runs the fused fast path (torch._transformer_encoder_layer_fwd)",
        build=lambda: _models().build_transformer_encoder(dim, heads, ffn, layers),
        inputs=lambda _b: (torch.randn(1, seq, dim, generator=torch.Generator().manual_seed(5)),),
    )


USER_CASES: list[Case] = [
    hf_decoder_case("llama", 1), hf_decoder_case("llama", 128),
    hf_decoder_case("gpt2", 1), hf_decoder_case("gpt2", 128),
    bert_case(), convnet_case(), mha_case(), transformer_encoder_case(),
]

CASES: list[Case] = [DECODER, DECODER_OPS, CHAIN, *USER_CASES]


def find(name: str, cases: list[Case] | None = None) -> Case:
    """The case called `name` (ValueError listing the names if there is none)."""
    pool = CASES if cases is None else cases
    for case in pool:
        if case.name == name:
            return case
    raise ValueError(f"no workload {name!r}; known: {', '.join(c.name for c in pool)}")
