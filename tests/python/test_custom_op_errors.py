"""Errors that teach: each custom-op mistake fails at compile time, names the op and shows the code to paste."""

from __future__ import annotations

import pytest
import torch

import graphex
from conftest import assert_same, compile_graphex
from examples import ops as example_ops

example_ops.load()
HERE = __file__.rsplit("/", 1)[-1]


@pytest.fixture(autouse=True)
def no_grad():
    with torch.no_grad():
        yield


def compile_error(fn, *args, **options) -> str:
    with pytest.raises(graphex.CustomOpError) as info:
        compile_graphex(fn, **options)(*args)
    return str(info.value)


def test_custom_op_without_fake():
    @torch.library.custom_op("gx_err1::double", mutates_args=())
    def double(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    msg = compile_error(lambda x: torch.ops.gx_err1.double(x) + 1, torch.randn(3))
    assert "gx_err1::double has no fake function" in msg
    assert "registered with torch.library.custom_op" in msg and HERE in msg
    assert "@double.register_fake\n    def _(x):" in msg and "return torch.empty_like(x)" in msg

    # The stand-in used to raise this is gone once the compile ends: registering a fake works as usual.
    double.register_fake(lambda x: torch.empty_like(x))
    torch._dynamo.reset()
    x = torch.randn(3)
    assert_same(compile_graphex(lambda x: torch.ops.gx_err1.double(x) + 1)(x), x * 2 + 1)


def test_stand_in_fakes_live_only_inside_a_compile():
    """Note [Where custom-op errors are caught]: outside a compile torch's registry is as the user left it, and
    another backend's compile of the same op gets torch's own message, not graphex's."""
    from torch._library.utils import has_fake_kernel

    @torch.library.custom_op("gx_err_scope::double", mutates_args=())
    def double(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    opdef = torch._library.custom_ops.OPDEFS["gx_err_scope::double"]
    assert opdef._abstract_fn is None and not has_fake_kernel(torch.ops.gx_err_scope.double.default)
    msg = compile_error(lambda x: torch.ops.gx_err_scope.double(x) + 1, torch.randn(3))
    assert "gx_err_scope::double has no fake function" in msg
    assert opdef._abstract_fn is None, "a stand-in fake outlived the compile"
    assert not has_fake_kernel(torch.ops.gx_err_scope.double.default)

    torch._dynamo.reset()
    import graphex.custom_ops
    graphex.custom_ops.install_trace_checks()  # the callbacks back, as the backend does when it runs
    with pytest.raises(Exception) as info:
        torch.compile(lambda x: torch.ops.gx_err_scope.double(x) + 1, backend="eager", fullgraph=True)(torch.randn(3))
    assert "There was no fake impl registered for" in str(info.value) and "graphex" not in str(info.value)
    assert opdef._abstract_fn is None


def test_library_op_without_meta():
    lib = torch.library.Library("gx_err2", "FRAGMENT")
    lib.define("double(Tensor x, float alpha) -> Tensor")
    lib.impl("double", lambda x, alpha: x * alpha, "CPU")
    msg = compile_error(lambda x: torch.ops.gx_err2.double(x, 2.0), torch.randn(3))
    assert "gx_err2::double has no fake (Meta) function" in msg and "torch.library.Library" in msg
    assert '_graphex_libs["gx_err2"] = torch.library.Library("gx_err2", "FRAGMENT")' in msg
    assert '_graphex_libs["gx_err2"].impl("double", double_meta, "Meta", allow_override=True)' in msg
    assert "def double_meta(x, alpha):" in msg


def test_cpp_op_without_meta():
    msg = compile_error(lambda x: torch.ops.graphex_examples.needs_meta(x), torch.randn(3))
    assert "graphex_examples::needs_meta has no fake (Meta) function" in msg
    assert "C++ TORCH_LIBRARY" in msg and "example_ops.cpp" in msg
    assert "TORCH_LIBRARY_IMPL(graphex_examples, Meta, m)" in msg and 'm.impl("needs_meta"' in msg
    assert '_graphex_libs["graphex_examples"].impl("needs_meta", needs_meta_meta, "Meta", allow_override=True)' \
        in msg  # from Python


def test_meta_function_on_a_real_device():
    lib = torch.library.Library("gx_err3", "FRAGMENT")
    lib.define("double(Tensor x) -> Tensor")
    lib.impl("double", lambda x: x * 2, "CPU")
    meta = torch.library.Library("gx_err3", "IMPL", "Meta")
    meta.impl("double", lambda x: torch.empty(x.shape, device="cpu"))
    msg = compile_error(lambda x: torch.ops.gx_err3.double(x), torch.randn(3))
    assert "gx_err3::double has a Meta function that returns a tensor on 'cpu'" in msg
    assert "return torch.empty_like(x)" in msg and "x.new_empty(shape)" in msg


def test_in_place_op_returning_its_mutated_input():
    lib = torch.library.Library("gx_err4", "FRAGMENT")
    lib.define("double_(Tensor(a!) x) -> Tensor(a!)")
    lib.impl("double_", lambda x: x.mul_(2), "CPU")
    meta = torch.library.Library("gx_err4", "IMPL", "Meta")
    meta.impl("double_", lambda x: x)
    msg = compile_error(lambda x: torch.ops.gx_err4.double_(x) + 1, torch.randn(3))
    assert "gx_err4::double_ returns its mutated input" in msg and "2.6" in msg
    assert 'lib.define("double_(Tensor(a!) x) -> ()")' in msg
    assert HERE in msg


@pytest.mark.parametrize("style", ["custom_op", "library"])
def test_fake_that_disagrees_with_the_kernel_is_caught_on_the_first_run(style):
    if style == "custom_op":
        @torch.library.custom_op("gx_err5::rowsum", mutates_args=())
        def rowsum(x: torch.Tensor) -> torch.Tensor:
            return x.sum(-1)

        @rowsum.register_fake
        def _(x):
            return torch.empty_like(x)  # wrong: the kernel drops the last dimension

        op = torch.ops.gx_err5.rowsum
    else:
        lib = torch.library.Library("gx_err6", "FRAGMENT")
        lib.define("rowsum(Tensor x) -> Tensor")
        lib.impl("rowsum", lambda x: x.sum(-1).to(torch.float64), "CPU")
        meta = torch.library.Library("gx_err6", "IMPL", "Meta")
        meta.impl("rowsum", lambda x: x.new_empty(x.shape[:-1]))  # wrong dtype: float32, kernel gives float64
        op = torch.ops.gx_err6.rowsum

    x = torch.randn(3, 4)
    msg = compile_error(lambda x: op(x) * 2, x)
    name = "gx_err5::rowsum" if style == "custom_op" else "gx_err6::rowsum"
    assert f"{name} has a fake/Meta function that disagrees with its real kernel" in msg
    if style == "custom_op":
        assert "fake float32[3, 4]" in msg and "real float32[3]" in msg and "@rowsum.register_fake" in msg
    else:
        assert "fake float32[3]" in msg and "real float64[3]" in msg and "the Meta function of rowsum" in msg
    assert "validate_fake" in msg and HERE in msg

    # The opt-out: no check (and here, since the kernel decides the real shape, the result is still eager's).
    torch._dynamo.reset()
    out = compile_graphex(lambda x: op(x) * 2, validate_fake=False)(x)
    assert_same(out, op(x) * 2)


def test_op_returning_an_alias_of_its_input():
    lib = torch.library.Library("gx_err7", "FRAGMENT")
    lib.define("flat(Tensor(a) x) -> Tensor(a)")
    lib.impl("flat", lambda x: x.view(-1), "CPU")
    meta = torch.library.Library("gx_err7", "IMPL", "Meta")
    meta.impl("flat", lambda x: x.view(-1))
    msg = compile_error(lambda x: torch.ops.gx_err7.flat(x) + 1, torch.randn(2, 3))
    assert "gx_err7::flat returns an alias of an input" in msg
    assert "return x.clone()" in msg and 'lib.define("flat(Tensor x) -> Tensor")' in msg
