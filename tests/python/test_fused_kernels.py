"""The graphex_fused C++ kernels (csrc/fused) against eager, within their stated tolerance.

Note [Fused kernels are close, not bitwise] (csrc/fused/library.cpp): float32 results within
abs(fused - eager) <= 1e-5 + 1e-5 * abs(eager). Each case id names the shapes, so a failure is
re-runnable with -k. Meta kernels are checked for the shapes and dtypes their CPU kernels return.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import graphex  # noqa: F401  (links the graphex_fused ops)
from conftest import FUSED_OP_TOL_FLOAT32, fused_op_tol

fused = torch.ops.graphex_fused
TOL = dict(atol=fused_op_tol(torch.float32), rtol=fused_op_tol(torch.float32))  # the stated float32 tolerance


def close(actual: torch.Tensor, expected: torch.Tensor) -> None:
    assert actual.shape == expected.shape and actual.dtype == expected.dtype
    torch.testing.assert_close(actual, expected, **TOL, equal_nan=True)


def rms_norm_eager(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def rotary_eager(x, cos, sin):
    return x * cos + rotate_half(x) * sin


def attention_eager(q, k, v, mask, scale):
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    scores = torch.matmul(q, k.transpose(2, 3)) * scale
    return torch.matmul(torch.softmax(scores.masked_fill(~mask, float("-inf")), -1), v)


def test_ops_are_linked_into_graphex():
    """Registrations in a static library are dropped by the linker; these come with `import graphex`."""
    for name in ("rms_norm", "add_rms_norm", "silu_mul", "gated_mlp", "gated_mlp_packed", "rotary", "decode_attention",
                 "matvec"):
        op = getattr(fused, name).default
        assert torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), "CPU"), name
        assert torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), "Meta"), name


def test_the_fused_kernels_run_on_atens_threads():
    """Note [The fused kernels run on ATen's OpenMP threads] (CMakeLists.txt): at::parallel_for, compiled as the fused
    kernels are, splits its work over torch.get_num_threads() threads (it ran everything on one before 2026-12-06)."""
    before = torch.get_num_threads()
    try:
        for threads in (1, 2, 3):
            torch.set_num_threads(threads)
            assert fused.intra_op_threads(8) == threads
            assert fused.intra_op_threads(1) == 1
    finally:
        torch.set_num_threads(before)


def test_a_result_does_not_depend_on_the_thread_count():
    """Each kernel splits only independent outputs over threads (rows, output columns, heads, pooling planes), so 1, 2
    and 3 threads give the same bits; the shapes are large enough that every kernel splits."""
    g = torch.Generator().manual_seed(5)
    q, k, v = torch.randn(1, 8, 1, 64, generator=g), torch.randn(1, 2, 256, 64, generator=g), \
        torch.randn(1, 2, 256, 64, generator=g)
    mask = torch.rand(1, 1, 1, 256, generator=g) > 0.2
    x1, xs = torch.randn(1, 512, generator=g), torch.randn(128, 256, generator=g)
    w, b = torch.randn(2048, 512, generator=g), torch.randn(2048, generator=g)
    w_kn = torch.randn(512, 2048, generator=g)
    gate, up = torch.randn(32, 512, generator=g), torch.randn(32, 512, generator=g)
    image = torch.randn(2, 32, 32, 32, generator=g)
    runs = {
        "matvec rows": lambda: fused.matvec(x1, w, b),
        "matvec columns": lambda: fused.matvec(x1, w_kn.t(), b),
        "matvec columns bfloat16": lambda: fused.matvec(x1.bfloat16(), w_kn.bfloat16().t()),
        "rms_norm": lambda: fused.rms_norm(xs, xs[0], 1e-6),
        "add_layer_norm": lambda: fused.add_layer_norm(xs, xs.flip(0), xs[1], xs[2], 1e-5),
        "decode_attention": lambda: fused.decode_attention(q, k, v, mask, 0.125),
        "silu_mul": lambda: fused.silu_mul(gate, up),
        "max_pool2d": lambda: fused.max_pool2d(image, [3, 3], [2, 2], [1, 1], [1, 1], False),
    }
    before = torch.get_num_threads()
    try:
        results = {}
        for threads in (1, 2, 3):
            torch.set_num_threads(threads)
            assert fused.intra_op_threads(8) == threads
            for name, run in runs.items():
                got = run()
                want = results.setdefault(name, got)
                for a, e in zip(*(t if isinstance(t, tuple) else (t,) for t in (got, want))):
                    assert torch.equal(a, e), f"{name}: {threads} threads differ from 1"
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("shape", [(1, 1, 256), (2, 3, 100), (5, 7), (4,), (0, 16), (3, 0, 8)],
                         ids=lambda s: "x".join(map(str, s)))
def test_rms_norm(shape):
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(shape, generator=g) * 3, torch.randn(shape[-1], generator=g)
    close(fused.rms_norm(x, w, 1e-6), rms_norm_eager(x, w, 1e-6))
    s, y = fused.add_rms_norm(x, x.flip(-1), w, 1e-5)
    torch.testing.assert_close(s, x + x.flip(-1), atol=0, rtol=0)  # the sum is exact
    close(y, rms_norm_eager(x + x.flip(-1), w, 1e-5))


def test_rms_norm_strided_and_broadcast_inputs():
    g = torch.Generator().manual_seed(1)
    base = torch.randn(4, 64, 6, generator=g)
    x = base.transpose(1, 2)  # last dimension of stride 6: made contiguous by the kernel
    w = torch.randn(64, generator=g)
    close(fused.rms_norm(x, w, 1e-6), rms_norm_eager(x, w, 1e-6))
    w1 = torch.randn(1, generator=g)  # one weight for the whole row
    close(fused.rms_norm(x, w1, 1e-6), rms_norm_eager(x, w1, 1e-6))
    r = torch.randn(64, generator=g)  # residual broadcast over rows: eager's add, then the fused norm
    s, y = fused.add_rms_norm(x, r, w, 1e-6)
    close(s, x + r)
    close(y, rms_norm_eager(x + r, w, 1e-6))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
def test_rms_norm_weight_offset_multiplies_by_offset_plus_weight(dtype):
    """Gemma's factor (1 + w), each element in float32 as `1.0 + w.float()` computes it; 0 is the weight itself
    (-0.0 weights keep their sign: the offset is not added at all)."""
    g = torch.Generator().manual_seed(5)
    x, w = (torch.randn(2, 3, 64, generator=g) * 3).to(dtype), (torch.randn(64, generator=g) * 0.1).to(dtype)

    def gemma(x, w, eps, c):
        h = x.float()
        return (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps) * (c + w.float())).to(x.dtype)

    tol = fused_op_tol(dtype)
    for c in (1.0, -0.5):
        torch.testing.assert_close(fused.rms_norm(x, w, 1e-6, c), gemma(x, w, 1e-6, c), rtol=tol, atol=tol)
        s, y = fused.add_rms_norm(x, x.flip(-1), w, 1e-6, c)
        torch.testing.assert_close(s, x + x.flip(-1), atol=0, rtol=0)
        torch.testing.assert_close(y, gemma(x + x.flip(-1), w, 1e-6, c), rtol=tol, atol=tol)
    w1 = torch.randn(1, generator=g).to(dtype)  # one weight for the whole row
    torch.testing.assert_close(fused.rms_norm(x, w1, 1e-6, 1.0), gemma(x, w1, 1e-6, 1.0), rtol=tol, atol=tol)
    zeros = torch.full((64,), -0.0, dtype=dtype)
    assert torch.equal(fused.rms_norm(x, zeros, 1e-6).signbit(), (-x).signbit() | (x == 0))  # -0.0 * x, not 0 * x


def test_rms_norm_weight_offset_with_a_weight_per_row_runs_eager_math():
    """An offset weight is computed once per call, so a weight that differs between rows takes eager's ops."""
    g = torch.Generator().manual_seed(6)
    x, w = torch.randn(3, 16, generator=g), torch.randn(3, 16, generator=g)
    close(fused.rms_norm(x, w, 1e-6, 1.0), rms_norm_eager(x, 1.0 + w, 1e-6))


def test_float64_runs_eager_math():
    """Not a fused dtype: the same math with ATen ops (the pattern pass never uses them there)."""
    x, w = torch.randn(3, 32).double(), torch.randn(32).double()
    torch.testing.assert_close(fused.rms_norm(x, w, 1e-6), rms_norm_eager(x, w, 1e-6), atol=0, rtol=0)
    g, u = torch.randn(3, 32).double(), torch.randn(3, 32).double()
    torch.testing.assert_close(fused.silu_mul(g, u), F.silu(g) * u, atol=0, rtol=0)


def _reduced_cases(dtype: torch.dtype, in_float64: bool = False):
    """(name, fused call, eager's code) per kernel, on inputs of `dtype` (the same values in float64 when
    `in_float64`: each bfloat16 / float16 value is a float64 exactly)."""
    g = torch.Generator().manual_seed(21)

    def r(*shape, scale=1.0):
        t = (torch.randn(*shape, generator=g) * scale).to(dtype)
        return t.double() if in_float64 else t

    x, res, w = r(3, 5, 96), r(3, 5, 96), r(96)
    gate, up = r(4, 200, scale=3.0), r(4, 200)
    xr, cos, sin = r(1, 4, 3, 64), r(1, 1, 3, 64), r(1, 1, 3, 64)
    q, k, v = r(2, 4, 1, 64), r(2, 2, 37, 64), r(2, 2, 37, 64)
    mask = torch.rand(1, 1, 1, 37, generator=g) < 0.7
    mask[..., 0] = True
    additive = r(2, 1, 1, 37).masked_fill(~mask, float("-inf"))
    xm, wg, wu, wd = r(2, 3, 64), r(96, 64, scale=0.125), r(96, 64, scale=0.125), r(48, 96, scale=0.125)

    def sdpa(q, k, v, m):
        return F.scaled_dot_product_attention(q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1), attn_mask=m,
                                              scale=0.125)

    return [
        ("rms_norm", lambda: fused.rms_norm(x, w, 1e-6), lambda: rms_norm_eager(x, w, 1e-6)),
        ("add_rms_norm", lambda: fused.add_rms_norm(x, res, w, 1e-6)[1], lambda: rms_norm_eager(x + res, w, 1e-6)),
        ("add_rms_norm_sum", lambda: fused.add_rms_norm(x, res, w, 1e-6)[0], lambda: x + res),
        ("silu_mul", lambda: fused.silu_mul(gate, up), lambda: F.silu(gate) * up),
        ("gated_mlp", lambda: fused.gated_mlp(xm, wg, wu, wd), lambda: F.linear(F.silu(F.linear(xm, wg)) * F.linear(xm, wu), wd)),
        ("gated_mlp_one_row", lambda: fused.gated_mlp(xm[:1, :1], wg, wu, wd),  # a decode step: matvec inside
         lambda: F.linear(F.silu(F.linear(xm[:1, :1], wg)) * F.linear(xm[:1, :1], wu), wd)),
        ("matvec", lambda: fused.matvec(xm[:1, :1], wg, wu[:, 0]), lambda: F.linear(xm[:1, :1], wg, wu[:, 0])),
        ("rotary", lambda: fused.rotary(xr, cos, sin), lambda: rotary_eager(xr, cos, sin)),
        ("attention_bool", lambda: fused.decode_attention(q, k, v, mask, 0.125, zero_masked_rows=True),
         lambda: sdpa(q, k, v, mask)),
        ("attention_additive", lambda: fused.decode_attention(q, k, v, additive, 0.125, zero_masked_rows=True),
         lambda: sdpa(q, k, v, additive)),
    ]


def test_matvec_is_eager_linear_within_the_reduced_tolerance():
    """matvec (csrc/fused/matvec.cpp): one row of x against eager's F.linear, with and without bias, odd and large
    K; float32, bfloat16 and float16, the weight row-major [N, K] or stored [K, N] (GPT-2's Conv1D); several rows
    and a weight in neither layout run eager's own linear (bitwise)."""
    g = torch.Generator().manual_seed(31)
    for dtype in (torch.bfloat16, torch.float16):
        tol = fused_op_tol(dtype)
        for K, N in ((1, 3), (7, 5), (64, 96), (200, 33), (1024, 40)):
            x = torch.randn(1, 1, K, generator=g).to(dtype)
            w, b = (torch.randn(N, K, generator=g) / 4).to(dtype), torch.randn(N, generator=g).to(dtype)
            w_kn = w.t().contiguous()  # the same weight stored [K, N]: matvec reads w_kn.t()
            for bias in (None, b):
                for weight in (w, w_kn.t()):
                    got, want = fused.matvec(x, weight, bias), F.linear(x, weight, bias)
                    assert got.shape == want.shape and got.dtype == dtype
                    torch.testing.assert_close(got, want, rtol=tol, atol=tol)
        x = torch.randn(3, 64, generator=g).to(dtype)  # several rows: eager's mm, bitwise
        w = torch.randn(16, 64, generator=g).to(dtype)
        assert torch.equal(fused.matvec(x, w), F.linear(x, w))
        ws = torch.randn(32, 64, generator=g).to(dtype)[::2]  # every other row: neither layout
        assert torch.equal(fused.matvec(x[:1], ws), F.linear(x[:1], ws))
    # float32 (Note [A float32 row runs matvec too], graphex/fusion/patterns.py): one row on either layout is ours,
    # within the float32 tolerance (N up to 2 * 64 + 17: the columns kernel's slices and their tails)
    for K, N in ((1, 3), (7, 5), (64, 96), (200, 33), (1024, 40), (4099, 7), (9, 145)):
        x, w, b = torch.randn(1, 1, K, generator=g), torch.randn(N, K, generator=g) / 4, torch.randn(N, generator=g)
        for bias in (None, b):
            for weight in (w, w.t().contiguous().t()):
                got, want = fused.matvec(x, weight, bias), F.linear(x, weight, bias)
                assert got.shape == want.shape and got.dtype == torch.float32
                torch.testing.assert_close(got, want, rtol=FUSED_OP_TOL_FLOAT32, atol=FUSED_OP_TOL_FLOAT32)
    x, w = torch.randn(3, 64), torch.randn(16, 64)
    assert torch.equal(fused.matvec(x, w), F.linear(x, w))
    assert fused.matvec(torch.randn(1, 0).bfloat16(), torch.randn(4, 0).bfloat16()).eq(0).all()
    with pytest.raises(RuntimeError, match="want x"):
        fused.matvec(torch.randn(1, 8).bfloat16(), torch.randn(4, 9).bfloat16())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("K", [5, 6, 7, 8, 17, 33, 66])
def test_matvec_keeps_eagers_infinities_and_nans_in_every_weight_row(dtype, K):
    """An inf, -inf or NaN weight in any row k (the [K, N] layout's passes of 16 rows and its K % 16 tail; a helper
    found the four-row kernel's tail, padded with copies of the real row, made 0 * inf = NaN where eager gives inf)
    and in x: the NaN and inf positions and their signs are eager's."""
    g = torch.Generator().manual_seed(32)
    N = 80
    for k in range(K):
        w = (torch.randn(N, K, generator=g) / 4).to(dtype)
        w[5, k], w[7, k], w[9, k] = float("inf"), -float("inf"), float("nan")
        x = torch.randn(1, K, generator=g).abs().to(dtype) + 0.5  # positive: an inf weight gives an inf of its sign
        for weight in (w, w.t().contiguous().t()):  # row-major [N, K], and stored [K, N] (GPT-2's Conv1D)
            got, want = fused.matvec(x, weight), F.linear(x, weight)
            assert torch.equal(got.isnan(), want.isnan()) and torch.equal(got.isinf(), want.isinf()), (k, weight.stride())
            assert torch.equal(got[got.isinf()], want[want.isinf()])
    x = torch.randn(1, K, generator=g).to(dtype)
    x[0, K - 1] = float("inf")
    w = (torch.randn(N, K, generator=g) / 4).to(dtype)
    for weight in (w, w.t().contiguous().t()):
        got, want = fused.matvec(x, weight), F.linear(x, weight)
        assert torch.equal(got.isnan(), want.isnan()) and torch.equal(got[got.isinf()], want[want.isinf()])


def _same_with_nans(got: torch.Tensor, want: torch.Tensor) -> bool:
    return bool(torch.equal(got.isnan(), want.isnan()) and torch.equal(got.nan_to_num(), want.nan_to_num()))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
def test_matvec_where_its_sums_overflow_is_eagers_linear(dtype):
    """Note [A product that is not finite is eager's] (csrc/fused/matvec.cpp): where an output is not finite the call
    is eager's F.linear, bit for bit. The helper's case: [2e19, 2e19, -1e19] . [2e19, -2e19, 1] is NaN in eager's mm
    (inf - inf) and was inf in matvec's four accumulators; and products past float32's range over many rows, where
    eager has NaN in some outputs and inf in others; in float16, a sum past 65504 (inf in both)."""
    g = torch.Generator().manual_seed(41)
    if dtype == torch.float16:  # float16's own range overflows, not float32's: 40000 + 40000 - 1
        big, cases = 1e3, [(torch.tensor([[2.0, 2.0, -1.0]]) * 1e2, torch.tensor([[2.0], [2.0], [1e-2]]) * 1e2)]
    else:
        big, cases = 1e19, [(torch.tensor([[2.0, 2.0, -1.0]]) * 1e19, torch.tensor([[2.0], [-2.0], [1e-19]]) * 1e19)]
    for K, N in ((65, 129), (129, 64), (7, 5)):
        cases.append((torch.randn(1, K, generator=g) * big, torch.randn(K, N, generator=g) * big))
    for x, w_kn in cases:
        x, w_kn = x.to(dtype), w_kn.to(dtype)
        b = torch.randn(w_kn.shape[1], generator=g).to(dtype)
        for weight in (w_kn.t(), w_kn.t().contiguous()):  # stored [K, N] (GPT-2's Conv1D), and row-major [N, K]
            for bias in (None, b):
                want = F.linear(x, weight, bias)
                assert not want.isfinite().all()  # the case is one where a sum overflows
                assert _same_with_nans(fused.matvec(x, weight, bias), want), (dtype, tuple(x.shape), weight.stride())


REDUCED = [(d, name) for d in (torch.bfloat16, torch.float16) for name, _, _ in _reduced_cases(d)]


@pytest.mark.parametrize("dtype,name", REDUCED, ids=[f"{str(d)[6:]}-{n}" for d, n in REDUCED])
def test_reduced_precision_is_eager_within_its_tolerance(dtype, name):
    """bfloat16 / float16 (Note [Reduced precision runs the float32 rows], csrc/fused/rows.h): the kernel reads
    each row as float32 and rounds once, eager rounds after each op. The promise (Note [Fused kernels are close,
    not bitwise]): |fused - eager| <= 4 eps (1 + |eager|), eps the dtype's; and the fused result is no farther
    from the float64 value of eager's code than eager's own result is, plus one rounding step."""
    fn, eager_fn = next((f, e) for n, f, e in _reduced_cases(dtype) if n == name)
    got, want = fn(), eager_fn()
    assert got.dtype == want.dtype == dtype and got.shape == want.shape
    eps = torch.finfo(dtype).eps
    torch.testing.assert_close(got, want, rtol=fused_op_tol(dtype), atol=fused_op_tol(dtype))
    # the float64 reference: eager's code on the same (exactly representable) inputs in float64
    exact = next(e for n, _, e in _reduced_cases(dtype, in_float64=True) if n == name)()
    fused_err = (got.double() - exact).abs().max().item()
    eager_err = (want.double() - exact).abs().max().item()
    assert fused_err <= eager_err + eps * (1 + exact.abs().max().item()), (fused_err, eager_err)


@pytest.mark.parametrize("shape", [(1, 1, 688), (2, 5, 37), (0, 8), (1,)], ids=lambda s: "x".join(map(str, s)))
def test_silu_mul(shape):
    g = torch.Generator().manual_seed(2)
    gate, up = torch.randn(shape, generator=g) * 4, torch.randn(shape, generator=g)
    close(fused.silu_mul(gate, up), F.silu(gate) * up)
    close(fused.silu_mul(gate.t() if gate.dim() == 2 else gate, up.t() if up.dim() == 2 else up),
          F.silu(gate.t() if gate.dim() == 2 else gate) * (up.t() if up.dim() == 2 else up))


@pytest.mark.parametrize("x_shape", [(1, 1, 64), (2, 3, 64), (4, 64), (0, 64)], ids=lambda s: "x".join(map(str, s)))
def test_gated_mlp(x_shape):
    g = torch.Generator().manual_seed(3)
    x = torch.randn(x_shape, generator=g)
    wg, wu, wd = (torch.randn(s, generator=g) / 8 for s in ((96, 64), (96, 64), (48, 96)))
    got = fused.gated_mlp(x, wg, wu, wd)
    close(got, F.linear(F.silu(F.linear(x, wg)) * F.linear(x, wu), wd))
    assert not got._is_view() and got._base is None  # its schema returns a new tensor, as eager's linear does


@pytest.mark.default_isa
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_a_reduced_silu_mul_rounds_where_eager_rounds(dtype):
    """Note [A reduced-precision silu is rounded before its product]: silu(gate) is rounded to the dtype, then the
    product; so the result is eager's two ops' but where silu's exp differs in its last float32 bit."""
    g = torch.Generator().manual_seed(6)
    gate, up = (torch.randn(64, 352, generator=g) * 8).to(dtype), (torch.randn(64, 352, generator=g) * 8).to(dtype)
    got, want = fused.silu_mul(gate, up), F.silu(gate) * up
    same = (got == want) | (got.isnan() & want.isnan())
    assert same.float().mean() > 0.999, same.float().mean()
    torch.testing.assert_close(got, want, atol=0, rtol=2 * torch.finfo(dtype).eps)  # one ulp where not equal


def test_a_gated_mlp_with_a_hidden_size_of_0_is_eagers():
    """reshape(-1, 0) is ambiguous: x is taken as rows of its last dimension by the product of the others."""
    x, wd = torch.randn(3, 5, 0), torch.randn(16, 32)
    assert torch.equal(fused.gated_mlp(x, torch.randn(32, 0), torch.randn(32, 0), wd), torch.zeros(3, 5, 16))
    assert torch.equal(fused.gated_mlp_packed(x, torch.randn(64, 0), wd), torch.zeros(3, 5, 16))


def _packed_mlp_eager(x, w_gate_up, wd, approximate):  # Phi3's MLP: one projection, chunked
    gate, up = F.linear(x, w_gate_up).chunk(2, dim=-1)
    act = F.silu(gate) if approximate is None else F.gelu(gate, approximate=approximate)
    return F.linear(up * act, wd)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("x_shape", [(1, 1, 64), (2, 3, 64), (4, 64), (0, 64)], ids=lambda s: "x".join(map(str, s)))
def test_a_packed_gated_mlp_is_the_chunked_projections(x_shape, dtype):
    """gated_mlp_packed: the gate is the product's first half, the up its second (Phi3's gate_up_proj)."""
    g = torch.Generator().manual_seed(4)
    x = torch.randn(x_shape, generator=g).to(dtype)
    w_gate_up, wd = (torch.randn(s, generator=g).div(8).to(dtype) for s in ((192, 64), (48, 96)))
    got = fused.gated_mlp_packed(x, w_gate_up, wd)
    want = _packed_mlp_eager(x, w_gate_up, wd, None)
    if dtype == torch.float32:
        close(got, want)
    else:  # one row runs matvec (float32 sums, rounded once): within the dtype's tolerance of eager
        torch.testing.assert_close(got.float(), want.float(), atol=2e-2, rtol=2e-2)
    assert got.shape == want.shape and got.dtype == dtype and not got._is_view() and got._base is None
    swapped = torch.cat((w_gate_up[96:], w_gate_up[:96]))  # the halves' order is the kernel's: the gate first
    if x.numel():
        assert not torch.allclose(fused.gated_mlp_packed(x, swapped, wd).float(), want.float(), atol=1e-3)


def _gated_is_eagers(got: torch.Tensor, want: torch.Tensor, rows: int) -> None:
    """Several rows: eager's mm, gelu and mul, so bitwise, infinities and NaNs in eager's places. One row (a decode
    step): matvec for the products (Note [A float32 row runs matvec too]), within the float32 tolerance."""
    assert got.shape == want.shape and torch.equal(got.isnan(), want.isnan())
    if rows == 1:
        torch.testing.assert_close(got, want, rtol=FUSED_OP_TOL_FLOAT32, atol=FUSED_OP_TOL_FLOAT32, equal_nan=True)
    else:
        assert torch.equal(got.nan_to_num(), want.nan_to_num())


# The gate's specials: +-1e30 (GELU 1e30 and -0; the outputs stay finite, so they are compared), and, in a second
# call, inf and NaN (GELU gives NaN or inf there, and every output NaN: only their places are compared). Until
# 2026-12-06 these tests put inf and NaN in every call, which made every output NaN and the comparison empty.
_GATE_EXTREMES = torch.tensor([1e30, -1e30, 3.0, -3.0]).unsqueeze(1)
_GATE_SPECIALS = torch.tensor([float("inf"), -float("inf"), float("nan"), 1e30]).unsqueeze(1)


@pytest.mark.default_isa
@pytest.mark.parametrize("activation,approximate", [("gelu", "none"), ("gelu_tanh", "tanh")])
@pytest.mark.parametrize("x_shape", [(1, 1, 64), (2, 3, 64), (4, 64)], ids=lambda s: "x".join(map(str, s)))
def test_a_packed_gelu_gated_mlp_is_eagers_bit_for_bit(x_shape, activation, approximate):
    """float32 of several rows: eager's one mm, its gelu on the gate half and its mul, so bitwise, specials
    included; one row within the float32 tolerance (_gated_is_eagers)."""
    g = torch.Generator().manual_seed(5)
    x = torch.randn(x_shape, generator=g)
    rows = x.numel() // x.shape[-1]
    w_gate_up, wd = torch.randn(192, 64, generator=g) / 8, torch.randn(48, 96, generator=g) / 8
    want = _packed_mlp_eager(x, w_gate_up, wd, approximate)
    assert want.isfinite().all()
    _gated_is_eagers(fused.gated_mlp_packed(x, w_gate_up, wd, activation), want, rows)
    for specials in (_GATE_EXTREMES, _GATE_SPECIALS):  # gate rows
        w = w_gate_up.clone()
        w[:4] = specials
        want = _packed_mlp_eager(x, w, wd, approximate)
        assert specials is _GATE_SPECIALS or want.isfinite().all()
        _gated_is_eagers(fused.gated_mlp_packed(x, w, wd, activation), want, rows)


def test_a_packed_gated_mlp_refuses_weights_that_do_not_chain():
    with pytest.raises(RuntimeError, match="w_gate_up = \\[2I, H\\]"):
        fused.gated_mlp_packed(torch.randn(2, 8), torch.randn(7, 8), torch.randn(8, 3))
    with pytest.raises(RuntimeError, match="activation must be"):
        fused.gated_mlp_packed(torch.randn(2, 8), torch.randn(6, 8), torch.randn(8, 3), "relu")


@pytest.mark.default_isa
@pytest.mark.parametrize("activation,approximate", [("gelu", "none"), ("gelu_tanh", "tanh")])
@pytest.mark.parametrize("x_shape", [(1, 1, 64), (2, 3, 64), (4, 64), (0, 64)], ids=lambda s: "x".join(map(str, s)))
def test_a_gelu_gated_mlp_is_eagers_bit_for_bit(x_shape, activation, approximate):
    """float32 of several rows: eager's mm, gelu and mul (in place), so bitwise; specials at the GELU's input are
    eager's too; one row within the float32 tolerance (_gated_is_eagers)."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(x_shape, generator=g)
    rows = x.numel() // x.shape[-1]
    wg, wu, wd = (torch.randn(s, generator=g) / 8 for s in ((96, 64), (96, 64), (48, 96)))

    def eager(wg):
        return F.linear(F.gelu(F.linear(x, wg), approximate=approximate) * F.linear(x, wu), wd)

    assert eager(wg).isfinite().all()
    _gated_is_eagers(fused.gated_mlp(x, wg, wu, wd, activation), eager(wg), rows)
    for specials in (_GATE_EXTREMES, _GATE_SPECIALS):  # gate rows
        w = wg.clone()
        w[:4] = specials
        assert specials is _GATE_SPECIALS or eager(w).isfinite().all()
        _gated_is_eagers(fused.gated_mlp(x, w, wu, wd, activation), eager(w), rows)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("activation,approximate", [("gelu", "none"), ("gelu_tanh", "tanh")])
def test_a_gelu_gated_mlp_in_reduced_precision(dtype, activation, approximate):
    """One row (matvec for the products) and several rows (eager's mm): within the reduced dtypes' tolerance."""
    g = torch.Generator().manual_seed(7)
    wg, wu, wd = (torch.randn(s, generator=g).to(dtype) / 8 for s in ((96, 64), (96, 64), (48, 96)))
    for rows in (1, 5):
        x = torch.randn(rows, 64, generator=g).to(dtype)
        want = F.linear(F.gelu(F.linear(x, wg), approximate=approximate) * F.linear(x, wu), wd)
        eps = torch.finfo(dtype).eps
        torch.testing.assert_close(fused.gated_mlp(x, wg, wu, wd, activation), want, atol=8 * eps, rtol=8 * eps)


def test_gated_mlp_rejects_an_unknown_activation():
    with pytest.raises(RuntimeError, match="activation must be 'silu', 'gelu' or 'gelu_tanh'"):
        fused.gated_mlp(torch.randn(2, 8), torch.randn(4, 8), torch.randn(4, 8), torch.randn(8, 4), "relu")


def test_gated_mlp_rejects_shapes_that_do_not_chain():
    with pytest.raises(RuntimeError, match="do not chain"):
        fused.gated_mlp(torch.randn(2, 8), torch.randn(4, 8), torch.randn(4, 8), torch.randn(8, 5))


@pytest.mark.parametrize("case", ["decoder", "llama", "strided", "batch_cos", "odd_rows", "empty"])
def test_rotary(case):
    g = torch.Generator().manual_seed(4)
    if case == "decoder":  # q of [B, T, H, D] transposed; cos/sin [1, 1, 1, D]
        x = torch.randn(1, 1, 4, 64, generator=g).transpose(1, 2)
        cos, sin = torch.randn(1, 1, 1, 64, generator=g), torch.randn(1, 1, 1, 64, generator=g)
    elif case == "llama":  # cos/sin [B, 1, T, D] (unsqueezed on the head dimension)
        x = torch.randn(2, 5, 3, 16, generator=g).transpose(1, 2)
        cos, sin = torch.randn(2, 1, 5, 16, generator=g), torch.randn(2, 1, 5, 16, generator=g)
    elif case == "strided":  # last dimension not of stride 1
        x = torch.randn(2, 8, 6, generator=g).transpose(1, 2)
        cos, sin = torch.randn(8, generator=g), torch.randn(8, generator=g)
    elif case == "batch_cos":  # cos and sin larger than x along a leading dimension: output is broadcast
        x = torch.randn(1, 12, generator=g)
        cos, sin = torch.randn(3, 12, generator=g), torch.randn(3, 12, generator=g)
    elif case == "odd_rows":  # a row shorter than a vector
        x = torch.randn(3, 6, generator=g)
        cos, sin = torch.randn(3, 6, generator=g), torch.randn(3, 6, generator=g)
    else:
        x = torch.randn(0, 4, 8, generator=g)
        cos, sin = torch.randn(4, 8, generator=g), torch.randn(4, 8, generator=g)
    close(fused.rotary(x, cos, sin), rotary_eager(x, cos, sin))


def rotary_every_two_eager(x, cos, sin):  # GPT-J: tables per element
    return x * cos + torch.stack((-x[..., 1::2], x[..., ::2]), dim=-1).flatten(-2) * sin


def rotary_pairs_eager(x, cos, sin):  # the pairs written out: tables per pair
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2)


@pytest.mark.default_isa
@pytest.mark.parametrize("per_pair", [False, True], ids=["per_element", "per_pair"])
@pytest.mark.parametrize("case", ["gptj", "transposed", "strided", "batch_cos", "one_pair", "empty", "specials"])
def test_interleaved_rotary_is_eagers_bit_for_bit_in_float32(case, per_pair):
    """Note in csrc/fused/rotary.cpp: each element sees eager's operations in eager's order (FMA off), so float32 is
    eager's bit for bit, NaN and inf included; cos and sin one entry per element (GPT-J) or per pair."""
    g = torch.Generator().manual_seed(11)
    shape = {"gptj": (1, 5, 4, 16), "transposed": (2, 5, 3, 8), "strided": (2, 3, 12), "batch_cos": (1, 12),
             "one_pair": (3, 2), "empty": (0, 4, 8), "specials": (2, 8)}[case]
    x = torch.randn(shape, generator=g) * 3
    if case == "transposed":
        x = x.transpose(1, 2)
    if case == "strided":  # the last dimension not of stride 1
        x = torch.randn(2, 12, 6, generator=g).transpose(1, 2)
    width = x.shape[-1] // 2 if per_pair else x.shape[-1]
    lead = {"gptj": (1, 5, 1), "transposed": (2, 1, 5), "batch_cos": (3,), "one_pair": (3,)}.get(case, x.shape[:-1])
    cos, sin = torch.randn(*lead, width, generator=g), torch.randn(*lead, width, generator=g)
    if case == "specials":
        x.view(-1)[:6] = torch.tensor([float("inf"), -float("inf"), float("nan"), 0.0, -0.0, 3e38])
        cos.view(-1)[:3] = torch.tensor([0.0, float("inf"), -0.0])
    want = (rotary_pairs_eager if per_pair else rotary_every_two_eager)(x, cos, sin)
    got = fused.rotary(x, cos, sin, True)
    assert got.shape == want.shape and got.dtype == want.dtype
    assert torch.equal(got.isnan(), want.isnan()) and torch.equal(got.nan_to_num(), want.nan_to_num())


@pytest.mark.default_isa
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("form", ["halves", "per_element", "per_pair"])
def test_rotary_in_reduced_precision_is_eagers_bit_for_bit(dtype, form):
    """Note [Rotary rounds as eager rounds] (csrc/fused/rotary.cpp): each product and sum rounded where eager rounds
    it, so bfloat16 / float16 are eager's bit for bit, a cancellation included (q * cos - q' * sin with q, q' close at
    pi / 4: eager 0, rounded once 0.35; found by a helper), NaN and inf too."""
    g = torch.Generator().manual_seed(12)
    x = torch.randn(2, 4, 3, 64, generator=g).to(dtype)
    width = 32 if form == "per_pair" else 64
    cos, sin = (torch.randn(1, 1, 3, width, generator=g).to(dtype) for _ in range(2))
    x[0, 0, 0] = 100.0  # a cancellation: every product of the first row about equal
    x[0, 0, 0, 1::2] = 99.5
    x[0, 0, 0, 32:] = 99.5
    cos[0, 0, 0], sin[0, 0, 0] = torch.tensor(torch.pi / 4).cos(), torch.tensor(torch.pi / 4).sin()
    x[1, 0, 0, :4] = torch.tensor([float("inf"), -float("inf"), float("nan"), -0.0])
    if form == "halves":
        want, got = rotary_eager(x, cos, sin), fused.rotary(x, cos, sin)
    else:
        want = (rotary_pairs_eager if form == "per_pair" else rotary_every_two_eager)(x, cos, sin)
        got = fused.rotary(x, cos, sin, True)
    assert got.dtype == dtype and torch.equal(got.isnan(), want.isnan())
    assert torch.equal(got.nan_to_num().view(torch.int16), want.nan_to_num().view(torch.int16))  # bits: signed zeros


def test_interleaved_rotary_rejects_tables_of_another_width():
    with pytest.raises(RuntimeError, match="half of it"):
        fused.rotary(torch.randn(2, 8), torch.randn(6), torch.randn(6), True)


def test_rotary_rejects_odd_rows():
    with pytest.raises(RuntimeError, match="must be even"):
        fused.rotary(torch.randn(2, 5), torch.randn(5), torch.randn(5))


@pytest.mark.parametrize("case", ["mha", "gqa", "strided_cache", "per_batch_mask", "prefill_rows", "all_masked"])
def test_decode_attention(case):
    g = torch.Generator().manual_seed(5)
    B, H, Hkv, T, S, D = 2, 4, 4, 1, 37, 64
    if case == "gqa":
        Hkv = 2
    if case == "prefill_rows":
        T = 3
    q = torch.randn(B, H, T, D, generator=g)
    k, v = torch.randn(B, Hkv, S, D, generator=g), torch.randn(B, Hkv, S, D, generator=g)
    mask = (torch.arange(S) <= 20)[None, None, None, :]
    if case == "strided_cache":  # a cache stored [B, S, H, D], seen as [B, H, S, D]
        k = torch.randn(B, S, Hkv, D, generator=g).transpose(1, 2)
        v = torch.randn(B, S, Hkv, D, generator=g).transpose(1, 2)
    if case == "per_batch_mask":
        mask = torch.rand(B, 1, T, S, generator=g) < 0.7
        mask[..., 0] = True
    if case == "all_masked":
        mask = torch.zeros(1, 1, 1, S, dtype=torch.bool)
    close(fused.decode_attention(q, k, v, mask, D ** -0.5), attention_eager(q, k, v, mask, D ** -0.5))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])  # the fast path and the ATen fallback
def test_decode_attention_zero_masked_rows_is_what_sdpa_gives(dtype):
    """zero_masked_rows=True (the SDPA patterns): a row with no position attended is 0, as
    F.scaled_dot_product_attention's CPU kernel gives; the other rows are unchanged."""
    g = torch.Generator().manual_seed(7)
    q, k, v = (torch.randn(2, 4, 1, 16, generator=g, dtype=dtype) for _ in range(3))
    k, v = torch.randn(2, 4, 9, 16, generator=g, dtype=dtype), torch.randn(2, 4, 9, 16, generator=g, dtype=dtype)
    mask = torch.rand(2, 4, 1, 9, generator=g) < 0.6
    mask[..., 0] = True
    mask[1, 2] = False
    got = fused.decode_attention(q, k, v, mask, 0.25, zero_masked_rows=True)
    want = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=0.25)
    assert torch.equal(got[1, 2], torch.zeros_like(got[1, 2]))
    close(got, want)
    nan_row = fused.decode_attention(q, k, v, mask, 0.25)[1, 2]
    assert nan_row.isnan().all()  # the default stays eager's softmax-over-all--inf


@pytest.mark.parametrize("case", ["zeros_and_neg_inf", "finfo_min", "bias", "per_head", "gqa", "strided_mask",
                                  "all_neg_inf_row", "nan_in_mask", "pos_inf_in_mask"])
@pytest.mark.parametrize("sdpa", [True, False])
def test_decode_attention_with_an_additive_mask_is_eager(case, sdpa):
    """An additive float mask (SDPA's float attn_mask, `scores * s + mask` written out) is added to the scaled
    scores; a -inf position is masked. Against eager's SDPA (zero_masked_rows) and eager's written-out softmax,
    edges included: a row all -inf (0 by SDPA, NaN written out), a NaN or +inf in the mask (NaN both ways)."""
    g = torch.Generator().manual_seed(11)
    B, H, Hkv, S, D = 2, 4, 4 if case != "gqa" else 2, 23, 32
    q = torch.randn(B, H, 1, D, generator=g)
    k, v = torch.randn(B, Hkv, S, D, generator=g), torch.randn(B, Hkv, S, D, generator=g)
    visible = torch.arange(S) <= 15
    mask = torch.zeros(1, 1, 1, S).masked_fill(~visible, float("-inf"))
    if case == "finfo_min":  # transformers' mask: the dtype's lowest finite value, not -inf
        mask = torch.zeros(1, 1, 1, S).masked_fill(~visible, torch.finfo(torch.float32).min)
    elif case == "bias":  # ALiBi-like: a bias on every position
        mask = torch.randn(B, 1, 1, S, generator=g)
    elif case == "per_head":
        mask = torch.randn(B, H, 1, S, generator=g).masked_fill(torch.rand(B, H, 1, S, generator=g) < 0.3, float("-inf"))
    elif case == "strided_mask":  # a slice of a longer mask: the last dimension not of stride 1
        mask = torch.randn(1, 1, 1, 2 * S, generator=g)[..., ::2]
    elif case == "all_neg_inf_row":
        mask = torch.zeros(B, H, 1, S)
        mask[1, 2] = float("-inf")
    elif case == "nan_in_mask":
        mask = mask.clone()
        mask[..., 3] = float("nan")
    elif case == "pos_inf_in_mask":
        mask = mask.clone()
        mask[..., 4] = float("inf")
    scale = D ** -0.5
    got = fused.decode_attention(q, k, v, mask, scale, zero_masked_rows=sdpa)
    kk, vv = k.repeat_interleave(H // Hkv, 1), v.repeat_interleave(H // Hkv, 1)
    if sdpa:
        want = F.scaled_dot_product_attention(q, kk, vv, attn_mask=mask, scale=scale)
    else:
        want = torch.matmul(torch.softmax(torch.matmul(q, kk.transpose(2, 3)) * scale + mask, dim=-1), vv)
    assert torch.equal(got.isnan(), want.isnan()), "NaN where eager has none, or none where eager has NaN"
    close(got, want)


def test_decode_attention_mask_of_another_dtype_is_refused():
    q = torch.randn(1, 2, 1, 8)
    with pytest.raises(RuntimeError, match="bool or of q's dtype"):
        fused.decode_attention(q, torch.randn(1, 2, 5, 8), torch.randn(1, 2, 5, 8), torch.zeros(1, 1, 1, 5).double(), 0.3)


def test_meta_kernels_give_the_cpu_shapes():
    cases = [
        (fused.rms_norm, (torch.randn(2, 3, 8), torch.randn(8), 1e-6)),
        (fused.add_rms_norm, (torch.randn(2, 3, 8), torch.randn(2, 3, 8), torch.randn(8), 1e-6)),
        (fused.silu_mul, (torch.randn(4, 6), torch.randn(4, 6))),
        (fused.gated_mlp, (torch.randn(2, 1, 8), torch.randn(12, 8), torch.randn(12, 8), torch.randn(5, 12))),
        (fused.gated_mlp_packed, (torch.randn(2, 1, 8), torch.randn(24, 8), torch.randn(5, 12))),
        (fused.rotary, (torch.randn(1, 4, 1, 8), torch.randn(1, 1, 1, 8), torch.randn(1, 1, 1, 8))),
        (fused.decode_attention, (torch.randn(1, 4, 1, 8), torch.randn(1, 2, 9, 8), torch.randn(1, 2, 9, 8),
                                  torch.ones(1, 1, 1, 9, dtype=torch.bool), 0.3)),
        (fused.matvec, (torch.randn(1, 1, 8).bfloat16(), torch.randn(5, 8).bfloat16(), torch.randn(5).bfloat16())),
    ]
    for op, args in cases:
        real = op(*args)
        meta = op(*[a.to("meta") if isinstance(a, torch.Tensor) else a for a in args])
        real, meta = (real, meta) if isinstance(real, tuple) else ((real,), (meta,))
        for r, m in zip(real, meta):
            assert m.device.type == "meta" and m.shape == r.shape and m.dtype == r.dtype, op


def test_opcheck():
    """torch.library.opcheck: schemas, fake (Meta) kernels and dispatch are consistent."""
    samples = [
        (fused.rms_norm.default, (torch.randn(2, 8), torch.randn(8), 1e-6)),
        (fused.add_rms_norm.default, (torch.randn(2, 8), torch.randn(2, 8), torch.randn(8), 1e-6)),
        (fused.silu_mul.default, (torch.randn(2, 8), torch.randn(2, 8))),
        (fused.gated_mlp.default, (torch.randn(2, 8), torch.randn(6, 8), torch.randn(6, 8), torch.randn(8, 6))),
        (fused.gated_mlp_packed.default, (torch.randn(2, 8), torch.randn(12, 8), torch.randn(8, 6))),
        (fused.rotary.default, (torch.randn(2, 8), torch.randn(8), torch.randn(8))),
        (fused.decode_attention.default, (torch.randn(1, 2, 1, 8), torch.randn(1, 2, 5, 8), torch.randn(1, 2, 5, 8),
                                          torch.ones(1, 1, 1, 5, dtype=torch.bool), 0.5)),
        (fused.matvec.default, (torch.randn(1, 8).bfloat16(), torch.randn(6, 8).bfloat16(), None)),
        (fused.matvec.default, (torch.randn(1, 8).half(), torch.randn(6, 8).half(), torch.randn(6).half())),
    ]
    for op, args in samples:
        torch.library.opcheck(op, args, test_utils=("test_schema", "test_faketensor"))


def test_baseline_row_kernels(tmp_path):
    """The row kernels exist once per CPU capability (Note [One row kernel per CPU capability]); this process
    runs the widest, a child with ATEN_CPU_CAPABILITY=default runs the baseline one, to the same tolerance."""
    import os
    import subprocess
    import sys

    script = tmp_path / "baseline.py"
    script.write_text(
        "import torch, graphex._C, torch.nn.functional as F  # graphex._C registers the kernels\n"
        "assert torch.backends.cpu.get_cpu_capability() == 'DEFAULT'\n"
        "f = torch.ops.graphex_fused\n"
        "tol = dict(atol=1e-5, rtol=1e-5)\n"
        "x, w = torch.randn(3, 37) * 3, torch.randn(37)\n"
        "torch.testing.assert_close(f.rms_norm(x, w, 1e-6), x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w, **tol)\n"
        "g, u = torch.randn(3, 37) * 4, torch.randn(3, 37)\n"
        "torch.testing.assert_close(f.silu_mul(g, u), F.silu(g) * u, **tol)\n"
        "q, k, v = torch.randn(1, 2, 1, 20), torch.randn(1, 2, 9, 20), torch.randn(1, 2, 9, 20)\n"
        "m = torch.ones(1, 1, 1, 9, dtype=torch.bool)\n"
        "ref = torch.softmax(q @ k.transpose(2, 3) * 0.2, -1) @ v\n"
        "torch.testing.assert_close(f.decode_attention(q, k, v, m, 0.2), ref, **tol)\n")
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "ATEN_CPU_CAPABILITY": "default"})
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("k", [0, 1, 15, 16, 17, 31])
def test_matvec_where_one_product_overflows_is_eagers_linear(dtype, k):
    """Note [matvec rounds every product] (csrc/fused/matvec.cpp): a product past float32's range that the sum before it
    would cancel, x = [.., 1, 2, ..] against [.., -1e38, 2e38, ..] in row k + 1 of either layout and in the [K, N]
    layout's passes of 16 rows and their tail: eager's linear is inf there, and so is matvec (it was 3e38 with fused
    multiply-adds: a helper's find, 2026-12-07)."""
    K, N = 33, 70
    g = torch.Generator().manual_seed(43)
    x = (torch.randn(1, K, generator=g) / 8).to(dtype)
    w_kn = (torch.randn(K, N, generator=g) / 8).to(dtype)
    x[0, k], x[0, k + 1] = 1.0, 2.0
    w_kn[k, 5], w_kn[k + 1, 5] = -1e38, 2e38
    for weight in (w_kn.t(), w_kn.t().contiguous()):  # stored [K, N] (GPT-2's Conv1D), and row-major [N, K]
        want = F.linear(x, weight)
        assert want[0, 5].isinf(), want[0, 5]  # the case is one where eager's product overflows
        assert _same_with_nans(fused.matvec(x, weight), want), (dtype, k, weight.stride())
