"""transformers' generate() through graphex, the way its users call it (docs/transformers.md): compile_config() makes
generate() compile its decode steps with graphex on the CPU, the tokens equal eager's, and graphex's engine ran
(captures counted through graphex.compile.on_capture); fused mode through the same call; a bad option fails when the
config is made."""

from __future__ import annotations

import pytest
import torch

from conftest import require

transformers = require("transformers")

import graphex  # noqa: E402
from graphex.compile import on_capture  # noqa: E402
from graphex.integrations.transformers import compile_config  # noqa: E402


def _model(arch: str) -> torch.nn.Module:
    transformers.logging.set_verbosity_error()
    torch.manual_seed(0)
    if arch == "llama":
        cfg = transformers.LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
        return transformers.LlamaForCausalLM(cfg).eval()
    cfg = transformers.GPT2Config(vocab_size=128, n_embd=64, n_layer=2, n_head=4, n_positions=64)
    return transformers.GPT2LMHeadModel(cfg).eval()


def _generate(model: torch.nn.Module, config) -> torch.Tensor:
    ids = torch.tensor([[5, 9, 2, 7, 1, 3]])
    with torch.no_grad():
        return model.generate(ids, max_new_tokens=8, min_new_tokens=8, do_sample=False, pad_token_id=0,
                              cache_implementation="static", compile_config=config)


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
@pytest.mark.parametrize("options", [None, {"pattern_fusion_pass": True}], ids=["exact", "fused"])
def test_generate_compiles_with_graphex_on_the_cpu_and_gives_eagers_tokens(arch: str, options) -> None:
    want = _generate(_model(arch), None)
    captured = []
    with on_capture(lambda dynamo_graph, compiled: captured.append(compiled)):
        got = _generate(_model(arch), compile_config(options))
        again = _generate(_model(arch), compile_config(options))
    assert torch.equal(got, want) and torch.equal(again, want)
    assert captured, "generate() did not compile with graphex (transformers' _compile_all_devices flag renamed?)"
    if options and arch == "llama":  # the float32 Llama's decode step has fused kernels to fire
        assert any(c.fused for c in captured), [c.fused for c in captured]


def test_the_plain_compile_config_stays_eager_on_the_cpu() -> None:
    """Why compile_config() sets transformers' flag: without it, generate() runs eagerly on the CPU and graphex never
    runs (if transformers changes that, compile_config's Note can go)."""
    captured = []
    with on_capture(lambda dynamo_graph, compiled: captured.append(compiled)):
        _generate(_model("llama"), transformers.CompileConfig(backend="graphex", fullgraph=True, dynamic=False))
    assert not captured


def test_a_bad_option_fails_when_the_config_is_made() -> None:
    with pytest.raises(graphex.OptionsError, match="pattern_fusion"):
        compile_config({"pattern_fusion": True})


def test_fused_mode_needs_no_mode_none() -> None:
    config = compile_config({"pattern_fusion_pass": True})
    assert config.mode is None and config.options == {"pattern_fusion_pass": True}
    assert compile_config().mode == "reduce-overhead"
