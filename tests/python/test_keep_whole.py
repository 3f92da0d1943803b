"""Note [Interpolation runs eager's kernel]: F.interpolate runs eager's own upsample kernel, bit for bit,
where AOTAutograd's Python decomposition (what aot_eager and inductor run) rounds differently."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from conftest import assert_same, compile_graphex, newest_capture

pytestmark = pytest.mark.default_isa  # run again under ATEN_CPU_CAPABILITY=default (make test-default-isa)

CASES = [
    ((1, 2, 5, 6), dict(scale_factor=2.0, mode="bilinear"), "aten::upsample_bilinear2d.default"),
    ((1, 2, 5, 6), dict(size=(10, 12), mode="bicubic", align_corners=True), "aten::upsample_bicubic2d.default"),
    ((2, 3, 9, 9), dict(scale_factor=0.5, mode="bicubic"), "aten::upsample_bicubic2d.default"),
    ((1, 2, 5, 6), dict(scale_factor=1.3, mode="bilinear", recompute_scale_factor=True),
     "aten::upsample_bilinear2d.default"),
    ((1, 2, 5, 6), dict(scale_factor=1.7, mode="bilinear", antialias=True), "aten::_upsample_bilinear2d_aa.default"),
    ((1, 2, 5, 6, 4), dict(scale_factor=1.5, mode="trilinear"), "aten::upsample_trilinear3d.default"),
    ((1, 2, 7), dict(scale_factor=1.5, mode="linear", align_corners=True), "aten::upsample_linear1d.default"),
]


def _targets() -> list[str]:
    return [t for _, t in newest_capture().executor.node_names()]


@pytest.mark.parametrize("shape,kwargs,kernel", CASES, ids=[f"{c[1]['mode']}-{i}" for i, c in enumerate(CASES)])
def test_interpolate_is_eagers_kernel_bit_for_bit(shape, kwargs, kernel):
    torch.manual_seed(0)
    x = torch.randn(shape)

    def f(x):
        return F.interpolate(x, **kwargs) * 2

    with torch.no_grad():
        assert_same(compile_graphex(f)(x), f(x))
    assert _targets() == [kernel, "aten::mul.Tensor"]


def test_aot_eager_differs_where_graphex_does_not():
    """The reason for the pass: without it these would differ from eager in the last bits."""
    torch.manual_seed(1)
    x = torch.randn(1, 2, 5, 6)

    def f(x):
        return F.interpolate(x, scale_factor=2.0, mode="bilinear")

    with torch.no_grad():
        expected = f(x)
        torch._dynamo.reset()
        aot = torch.compile(f, backend="aot_eager", fullgraph=True, dynamic=False)(x)
        assert not torch.equal(aot, expected), "torch's decomposition now matches eager: this pass may be unneeded"
        assert_same(compile_graphex(f)(x), expected)


def test_upsample_module_channels_last_input():
    torch.manual_seed(2)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.Upsample(scale_factor=2, mode="bilinear")).eval()
    x = torch.randn(2, 3, 8, 8).to(memory_format=torch.channels_last)
    with torch.no_grad():
        assert_same(compile_graphex(model)(x), model(x))
    assert "aten::upsample_bilinear2d.default" in _targets()
    assert not any("graphex_whole" in t for t in _targets())


def test_with_autograd_the_decomposition_keeps_its_derivative():
    torch.manual_seed(3)
    x = torch.randn(1, 2, 5, 6, requires_grad=True)
    x_ref = x.detach().clone().requires_grad_(True)

    def f(x):
        return F.interpolate(x, scale_factor=2.0, mode="bilinear").sum()

    compiled = compile_graphex(f)
    out = compiled(x)
    out.backward()
    torch._dynamo.reset()
    ref = torch.compile(f, backend="aot_eager", fullgraph=True)(x_ref)
    ref.backward()
    assert_same(out, ref)
    assert_same(x.grad, x_ref.grad)


def test_dynamic_shapes_leave_the_call_alone():
    torch.manual_seed(4)

    def f(x):
        return F.interpolate(x, scale_factor=2.0, mode="bilinear")

    compiled = compile_graphex(f, dynamic=True)
    with torch.no_grad():
        for size in (5, 7):
            x = torch.randn(1, 2, size, size)
            out = compiled(x)
            assert out.shape == f(x).shape
            assert torch.allclose(out, f(x), atol=1e-5)


@pytest.mark.filterwarnings("ignore:`nn.functional.upsample_bilinear` is deprecated:UserWarning")
def test_deprecated_upsample_bilinear_too():
    torch.manual_seed(5)
    x = torch.randn(1, 3, 4, 5)

    def f(x):
        return F.upsample_bilinear(x, scale_factor=2)

    with torch.no_grad(), pytest.warns(UserWarning):
        expected = f(x)
    with torch.no_grad():
        assert_same(compile_graphex(f)(x), expected)
    assert _targets() == ["aten::upsample_bilinear2d.default"]
