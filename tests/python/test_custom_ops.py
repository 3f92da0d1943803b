"""Custom operators in graphex graphs: the three registration paths, in place and out of place.

Every case runs the same function eagerly and compiled with graphex, checks outputs
and mutated tensors with torch.equal, and checks that the op ran inside the C++
engine (not a graph break, not a Python fallback of the whole graph).
"""

from __future__ import annotations

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from conftest import assert_same, compile_graphex, engine_runs, newest_capture
from examples import ops as example_ops

example_ops.load()
ex = torch.ops.graphex_examples


# -- path 1: torch.library.custom_op + register_fake ---------------------------------------------
@torch.library.custom_op("gx_co::scale", mutates_args=(), device_types="cpu")
def co_scale(x: torch.Tensor, s: float) -> torch.Tensor:
    return x * s


@co_scale.register_fake
def _(x, s):
    return torch.empty_like(x)


@torch.library.custom_op("gx_co::scale_", mutates_args=("x",), device_types="cpu")
def co_scale_(x: torch.Tensor, s: float) -> None:
    x.mul_(s)


@co_scale_.register_fake
def _(x, s):
    return None


# -- path 2: torch.library.Library FRAGMENT + impl + Meta library ---------------------------------
_lib = torch.library.Library("gx_lib", "FRAGMENT")
_lib.define("scale(Tensor x, float s) -> Tensor")
_lib.define("scale_(Tensor(a!) x, float s) -> ()")
_lib.define("shift(Tensor x, float s) -> Tensor")  # device-generic kernel
_lib.define("my_op(Tensor x, Tensor? y, Tensor[] z, float attr1, int attr2) -> Tensor")
_meta = torch.library.Library("gx_lib", "IMPL", "Meta")


@torch.library.impl(_lib, "scale", "CPU")
def lib_scale(x, s):
    return x * s


@torch.library.impl(_lib, "scale_", "CPU")
def lib_scale_(x, s):
    x.mul_(s)


@torch.library.impl(_lib, "shift", "CompositeExplicitAutograd")
def lib_shift(x, s):
    return x + s


@torch.library.impl(_lib, "my_op", "CPU")
def lib_my_op(x, y, z, attr1, attr2):
    out = x * attr1 + attr2
    if y is not None:
        out = out + y
    for t in z:
        out = out * t
    return out


@torch.library.impl(_meta, "scale")
def _(x, s):
    return torch.empty_like(x)


@torch.library.impl(_meta, "scale_")
def _(x, s):
    return None


@torch.library.impl(_meta, "my_op")
def _(x, y, z, attr1, attr2):
    return torch.empty_like(x)


# -- path 3: C++ TORCH_LIBRARY (examples/ops): Meta in C++ or from Python -------------------------
OUT_OF_PLACE = {
    "custom_op": lambda x: torch.ops.gx_co.scale(x, 1.5),
    "library": lambda x: torch.ops.gx_lib.scale(x, 1.5),
    "library-composite": lambda x: torch.ops.gx_lib.shift(x, 0.25),
    "cpp-meta-in-cpp": lambda x: ex.rms_norm(x, torch.full((x.shape[-1],), 0.5), 1e-6),
    "cpp-meta-in-python": lambda x: ex.scale_rows(x, torch.arange(x.shape[0], dtype=x.dtype)),
}
IN_PLACE = {
    "custom_op": lambda x: torch.ops.gx_co.scale_(x, 1.5),
    "library": lambda x: torch.ops.gx_lib.scale_(x, 1.5),
    "cpp-meta-in-python": lambda x: ex.scale_rows_(x, torch.arange(x.shape[0], dtype=x.dtype)),
}
OP_NAME = {"custom_op": "gx_co::scale", "library": "gx_lib::scale", "library-composite": "gx_lib::shift",
           "cpp-meta-in-cpp": "graphex_examples::rms_norm", "cpp-meta-in-python": "graphex_examples::scale_rows"}


@pytest.fixture(autouse=True)
def no_grad():
    with torch.no_grad():
        yield


def program_targets() -> list[str]:
    return [target for _, target in newest_capture().executor.node_names()]


def graph_level_copies(prof, shape) -> list[str]:
    shape = list(shape)
    return [f"{e.name}{e.input_shapes}" for e in prof.events()
            if e.name in ("aten::clone", "aten::copy_", "aten::_to_copy") and shape in (e.input_shapes or [])
            and e.cpu_parent is not None and e.cpu_parent.name.startswith("graph_")]


@pytest.mark.parametrize("path", sorted(OUT_OF_PLACE))
def test_out_of_place_op_runs_in_the_engine(path):
    op = OUT_OF_PLACE[path]

    def f(x):
        return op(x.relu()) - 1.0

    x = torch.randn(4, 6)
    expected = f(x)
    compiled = compile_graphex(f)
    before = engine_runs()
    assert_same(compiled(x), expected)
    assert engine_runs() == before + 1
    assert any(t.startswith(OP_NAME[path]) for t in program_targets()), program_targets()


@pytest.mark.parametrize("path", sorted(IN_PLACE))
def test_in_place_op_mutates_the_callers_tensor_with_no_copy(path):
    op = IN_PLACE[path]

    def f(x, y):
        op(x)
        return x.sum() + y

    x, y = torch.randn(4, 6), torch.randn(())
    x_ref = x.clone()
    expected = f(x_ref, y)
    compiled = compile_graphex(f)
    compiled(x.clone(), y)  # capture
    ptr = x.data_ptr()
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        out = compiled(x, y)
    assert_same(out, expected)
    assert_same(x, x_ref, "mutated input")
    assert x.data_ptr() == ptr
    assert graph_level_copies(prof, x.shape) == []
    name = OP_NAME.get(path, "")
    assert any(t.startswith(name.rsplit("::", 1)[0]) for t in program_targets()), program_targets()


def test_template_schema_optional_tensor_list_float_int():
    def f(x, y, z0, z1):
        a = torch.ops.gx_lib.my_op(x, y, [z0, z1], 0.5, 3)
        b = torch.ops.gx_lib.my_op(x, None, [z1], 2.0, -1)
        return a, b

    args = [torch.randn(3, 4) for _ in range(4)]
    compiled = compile_graphex(f)
    assert_same(compiled(*args), f(*args))
    assert program_targets().count("gx_lib::my_op.default") == 2


def test_several_outputs_and_several_mutated_arguments_on_views_of_inputs():
    """rotary_embedding returns two tensors; kv_cache_update_ mutates two caches, each a page (view) of an input."""
    cos, sin = torch.randn(1, 1, 1, 8), torch.randn(1, 1, 1, 8)

    def f(q, k, v, pos, k_cache, v_cache):
        q2, k2 = ex.rotary_embedding(q, k, cos, sin)
        for layer in range(2):
            ex.kv_cache_update_(k_cache[layer], v_cache[layer], pos, k2 * (layer + 1), v)
        return q2 @ k_cache[1].transpose(2, 3)

    q, k, v = (torch.randn(1, 2, 1, 8) for _ in range(3))
    pos = torch.tensor([3])
    caches = [torch.zeros(2, 1, 2, 6, 8) for _ in range(2)]
    ref_caches = [c.clone() for c in caches]
    expected = f(q, k, v, pos, *ref_caches)
    compiled = compile_graphex(f)
    compiled(q, k, v, pos, *[c.clone() for c in caches])  # capture
    ptrs = [c.data_ptr() for c in caches]
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        out = compiled(q, k, v, pos, *caches)
    assert_same(out, expected)
    assert_same(caches, ref_caches, "caches")
    assert [c.data_ptr() for c in caches] == ptrs
    assert graph_level_copies(prof, caches[0].shape) == [] and graph_level_copies(prof, caches[0][0].shape) == []
    assert program_targets().count("graphex_examples::kv_cache_update_.default") == 2
    assert newest_capture().kept_copies == []


def test_in_place_op_on_an_intermediate_is_reinplaced():
    def f(x):
        h = x * 2
        torch.ops.gx_co.scale_(h, 3.0)
        return h + 1

    x = torch.randn(5)
    compiled = compile_graphex(f)
    assert_same(compiled(x), f(x))
    targets = program_targets()
    assert "gx_co::scale_.default" in targets and "aten::clone.default" not in targets, targets


def test_disabled_inplace_pass_keeps_a_copy_and_says_why(monkeypatch, capfd):
    monkeypatch.setenv("GRAPHEX_LOG", "1")

    def f(x):
        h = x * 2
        torch.ops.gx_co.scale_(h, 3.0)
        return h + 1

    x = torch.randn(5)
    assert_same(compile_graphex(f, inplace_pass=False)(x), f(x))
    err = capfd.readouterr().err
    assert "kept a copy of" in err and "gx_co.scale_" in err and "inplace_pass=False" in err, err


def test_decoder_with_the_example_ops_matches_the_pure_decoder_bit_for_bit():
    from examples.models.decoder import DecoderConfig, build_decoder, decode

    cfg = DecoderConfig(layers=2, max_positions=32)
    pure = build_decoder(cfg)
    with_ops = build_decoder(DecoderConfig(layers=2, max_positions=32, custom_ops=True))
    compiled = compile_graphex(with_ops)
    expected = decode(pure, 6)
    assert_same(decode(compiled, 6), expected)
    targets = program_targets()
    assert {"graphex_examples::rms_norm.default", "graphex_examples::rotary_embedding.default",
            "graphex_examples::kv_cache_update_.default"} <= set(targets)


@pytest.mark.parametrize("name", ["rms_norm", "rotary_embedding", "kv_cache_update_", "scale_rows", "scale_rows_"])
def test_opcheck_passes_on_the_example_library(name):
    args = {
        "rms_norm": (torch.randn(2, 8), torch.randn(8), 1e-6),
        "rotary_embedding": (torch.randn(1, 2, 1, 8), torch.randn(1, 2, 1, 8), torch.randn(1, 1, 1, 8),
                             torch.randn(1, 1, 1, 8)),
        "kv_cache_update_": (torch.zeros(1, 2, 6, 8), torch.zeros(1, 2, 6, 8), torch.tensor([2]),
                             torch.randn(1, 2, 1, 8), torch.randn(1, 2, 1, 8)),
        "scale_rows": (torch.randn(3, 4), torch.randn(3)),
        "scale_rows_": (torch.randn(3, 4), torch.randn(3)),
    }[name]
    torch.library.opcheck(getattr(ex, name).default, args)
