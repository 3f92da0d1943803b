"""The workloads the benchmark measures: a list of `Case` objects.

To add a workload, write a `Case` (a name, what to compile, how to make its inputs)
and append it to `CASES`. Everything else (backends, timing, first call, memory,
the report) works on any case.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

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
    """

    name: str
    description: str
    build: Callable[[], Callable[..., Any]]
    inputs: Callable[[Any], tuple[Any, ...]]
    ops: int | None = None
    handwritten: Handwritten | None = None


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

CASES: list[Case] = [DECODER, DECODER_OPS, CHAIN]


def find(name: str, cases: list[Case] | None = None) -> Case:
    """The case called `name` (ValueError listing the names if there is none)."""
    pool = CASES if cases is None else cases
    for case in pool:
        if case.name == name:
            return case
    raise ValueError(f"no workload {name!r}; known: {', '.join(c.name for c in pool)}")
