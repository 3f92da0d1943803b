"""A subset of `make fusion-coverage` (sweeps/fusion_coverage.py): fused mode on decoders spelled the ways model code
spells them stays correct (tokens equal to eager over 16 steps, logits within the model tolerance where a kernel
fired, bitwise where none did), and what it catches does not shrink unnoticed: the baseline spelling fires every
kernel it fired when this test was written, and a norm of another meaning (eps outside the square root) is never
fused as RMSNorm."""

from __future__ import annotations

import pytest

from conftest import require

from sweeps import coverage_decoder as cd
from sweeps import fusion_coverage as fc

SUBSET = [
    cd.Spelling(),
    cd.Spelling(norm="llama"), cd.Spelling(norm="gemma"), cd.Spelling(norm="eps_outside"), cd.Spelling(norm="layernorm"),
    cd.Spelling(attention="written"), cd.Spelling(gqa="repeat_interleave"), cd.Spelling(mask="additive"),
    cd.Spelling(scale="given"), cd.Spelling(mlp="fused_gate_up"), cd.Spelling(rotary="interleaved"),
    cd.Spelling(rotary="partial"), cd.Spelling(rotary="complex"), cd.Spelling(rotary="complex", dtype="bfloat16"),
    cd.Spelling(dtype="bfloat16"),
]


@pytest.mark.parametrize("spelling", SUBSET, ids=[s.name for s in SUBSET])
def test_a_spelling_decodes_as_eager_does(spelling: cd.Spelling) -> None:
    row = fc.run_variant(spelling)
    assert row.ok, (row.name, row.error, row.fired, row.tokens_equal, row.max_diff)
    if spelling in (cd.Spelling(), cd.Spelling(scale="given"), cd.Spelling(gqa="repeat_interleave")):
        assert {"add_rms_norm", "rms_norm", "gated_mlp", "rotary", "decode_attention"} <= set(row.fired), row.fired
    if spelling == cd.Spelling(mlp="fused_gate_up"):  # Phi3's up * silu(gate) after a chunked projection
        assert "gated_mlp_packed" in row.fired and "silu_mul" not in row.fired, row.fired
    if spelling.rotary == "complex":  # Meta's complex product with freqs_cis runs the interleaved rotary kernel
        assert "rotary" in row.fired, row.fired
    if spelling.norm in ("eps_outside", "layernorm"):
        assert not {"rms_norm", "add_rms_norm"} & set(row.fired), row.fired
    if spelling == cd.Spelling(dtype="bfloat16"):  # the baseline in bfloat16 fuses as in float32
        assert {"add_rms_norm", "rms_norm", "gated_mlp", "rotary", "decode_attention"} <= set(row.fired), row.fired


def test_every_generated_spelling_is_distinct_and_buildable() -> None:
    spellings = cd.variants(40)
    assert len({s.name for s in spellings}) == len(spellings) == 40
    assert spellings[0] == cd.Spelling()


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_transformers_decoders_generate_eagers_tokens_fused(arch: str) -> None:
    require("transformers")
    row = fc.run_hf(arch, fc.torch.float32)
    assert row.ok and not row.not_graphex, (row.name, row.error, row.fired, row.tokens_equal, row.max_diff)
    assert "decode_attention" in row.fired, row.fired
