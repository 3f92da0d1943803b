"""The model zoo: each model compiled with graphex gives exactly eager's results (torch.equal)."""

from __future__ import annotations

import pytest
import torch

from conftest import assert_same, captures, compile_graphex, engine_runs
from examples.models.decoder import DecoderConfig, build_decoder
from examples.models.zoo import MLP, ReturnsViews, SeveralOutputs, SmallCNN, init_batchnorm_stats

pytestmark = pytest.mark.default_isa  # run again under ATEN_CPU_CAPABILITY=default (make test-default-isa)


@pytest.fixture(autouse=True)
def no_grad():
    with torch.no_grad():
        yield


def check(model, *inputs, calls=3):
    torch.manual_seed(0)
    compiled = compile_graphex(model)
    before = engine_runs()
    for _ in range(calls):
        assert_same(compiled(*inputs), model(*inputs))
    assert engine_runs() == before + calls


def test_mlp_layernorm_gelu_residual():
    torch.manual_seed(1)
    check(MLP().eval(), torch.randn(8, 64))


def test_cnn_conv_batchnorm_relu_pool_linear():
    torch.manual_seed(2)
    check(init_batchnorm_stats(SmallCNN()).eval(), torch.randn(2, 3, 16, 16))


def test_model_returning_views_of_its_input():
    x = torch.randn(4, 5)
    compiled = compile_graphex(ReturnsViews())
    out = compiled(x)
    assert_same(out, ReturnsViews()(x))
    assert [t.data_ptr() for t in out[:3]] == [x.data_ptr(), x.data_ptr(), x[:, 1:].data_ptr()]


def test_model_returning_several_outputs_and_an_int():
    torch.manual_seed(3)
    check(SeveralOutputs(), torch.randn(5, 8))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_llama_decoder_decode_loop_matches_eager_and_updates_caches_in_place(dtype):
    cfg = DecoderConfig(layers=2, max_positions=32)
    model = build_decoder(cfg).to(dtype)
    # Graphs an earlier test in this worker left alive (pytest-xdist runs other files first, in no fixed order)
    # are not this loop's: count only those made here.
    earlier = captures()
    compiled = compile_graphex(model)
    k_ref, v_ref = model.new_cache(dtype=dtype)
    k, v = model.new_cache(dtype=dtype)
    ptrs = (k.data_ptr(), v.data_ptr())
    tokens_ref = tokens = torch.tensor([[3]])
    before = engine_runs()
    for step in range(10):
        pos = torch.tensor([step])
        expected = model(tokens_ref, pos, k_ref, v_ref)
        actual = compiled(tokens, pos, k, v)
        assert_same(actual, expected, f"logits at step {step}")
        assert_same(k, k_ref, f"k cache at step {step}")
        assert_same(v, v_ref, f"v cache at step {step}")
        tokens_ref = expected[:, -1].argmax(-1, keepdim=True)
        tokens = actual[:, -1].argmax(-1, keepdim=True)
    assert (k.data_ptr(), v.data_ptr()) == ptrs
    assert engine_runs() == before + 10
    made_here = [g for g in captures() if not any(g is e for e in earlier)]
    assert len(made_here) == 1, "the decode loop recompiled"
    assert made_here[0].kept_copies == []
