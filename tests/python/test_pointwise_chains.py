"""Note [Element-wise chains are fused by rule, not by pattern]: chains of element-wise ops run as one
graphex_fused::pointwise in fused mode, within fused mode's tolerance of eager (bitwise where every op of the
chain is exact in float32 or rounds as eager does), and every near miss stays eager's.
"""

from __future__ import annotations

import math
import operator
import random

import pytest
import torch
import torch.nn.functional as F

import graphex  # noqa: F401
import graphex._C  # noqa: F401  (graphex_fused::*)
from graphex.fusion.chains import find_groups, kernel_tables

from conftest import captures, fused_op_tol

FUSED = {"pattern_fusion_pass": True}
DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _compile(fn, **options):
    torch._dynamo.reset()
    return torch.compile(fn, backend="graphex", fullgraph=True, dynamic=False, options={**FUSED, **options})


def _pointwise_calls() -> int:
    return sum(1 for c in captures() for n in c.gm.graph.nodes
               if n.op == "call_function" and n.target is torch.ops.graphex_fused.pointwise.default)


def _close(got: torch.Tensor, want: torch.Tensor, tol: float) -> None:
    assert got.dtype == want.dtype and got.shape == want.shape
    g, w = got.double(), want.double()
    same_nan = torch.isnan(g) == torch.isnan(w)
    assert bool(same_nan.all()), "NaN where eager has none, or none where eager has one"
    g, w = g.nan_to_num(0.0, 1e300, -1e300), w.nan_to_num(0.0, 1e300, -1e300)
    bad = (g - w).abs() > tol * (1 + w.abs())
    assert not bool(bad.any()), f"max |fused - eager| {(g - w).abs().max().item()} over tol {tol}"


def _gelu_new(x):  # GPT-2's written-out tanh GELU
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


def _bloom_gelu(x):  # Bloom's
    return x * 0.5 * (1.0 + torch.tanh(0.79788456 * x * (1 + 0.044715 * x * x)))


# (name, function, input shapes): each a chain of the table's ops, with broadcasting, numbers and 0-dim tensors
CHAINS = [
    ("tanh_of_affine", lambda x, y: torch.tanh(x * y + 1.5), [(3, 40), (40,)]),
    ("gelu_new", lambda x: _gelu_new(x), [(2, 1, 200)]),
    ("bloom_gelu", lambda x: _bloom_gelu(x), [(1, 1, 130)]),
    ("bias_gelu_tanh", lambda x, b: F.gelu(x + b, approximate="tanh"), [(4, 33), (33,)]),
    ("bias_gelu_erf", lambda x, b: F.gelu(x + b), [(4, 33), (33,)]),  # eager's: oneDNN's (gelu_erf's Note)
    ("gelu_erf_gated", lambda x, y: F.gelu(x) * y, [(3, 700), (3, 700)]),
    ("residual_relu", lambda x, r: torch.relu(x + r), [(2, 8, 5, 5), (2, 8, 5, 5)]),
    ("sigmoid_gate", lambda x, y: torch.sigmoid(x) * y - x, [(5, 17), (5, 17)]),
    ("exp_div", lambda x: torch.exp(x - 2.0) / 3.0, [(1000,)]),
    ("rsqrt_abs", lambda x: torch.rsqrt(x.abs() + 1e-3) * 0.5, [(7, 9)]),
    ("sqrt_rsub", lambda x: 1 - torch.sqrt(x.abs()) * 2, [(64,)]),
    ("powers", lambda x: x ** 2 + x ** 3 - x.abs() ** 0.5 + (x.abs() + 1) ** 1.7 + (x.abs() + 1) ** -1 - x.abs() ** -0.5,
     [(600,)]),
    ("max_min", lambda x, y: torch.maximum(x, y).neg() + torch.minimum(x, y) * 2, [(3, 1, 8), (1, 5, 8)]),
    ("log_sin_cos_erf", lambda x, y: torch.log(x.abs() + 1) * torch.sin(x) + torch.cos(y) - torch.erf(y), [(50,), (50,)]),
    ("where", lambda x, y: torch.where(x > 0, x * 2, y + 1) * 3, [(4, 30), (4, 30)]),
    ("reciprocal_silu", lambda x: F.silu(x.reciprocal() * 0.1 + x), [(31,)]),
    ("zero_dim", lambda x, s: (x * s + s).tanh(), [(6, 6), ()]),
    ("three_broadcasts", lambda x, y, z: (x * y + z) * 0.25 - y, [(4, 1, 8), (3, 8), (8,)]),
    ("shared_subterm", lambda x: (lambda t: t * t + t)(x * 0.5 + 1), [(2, 700)]),  # one value, several users
    ("big", lambda x, y: torch.tanh(x * 0.5 + y) * y, [(4, 70001), (70001,)]),  # several tiles, several threads
]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name,fn,shapes", CHAINS, ids=[c[0] for c in CHAINS])
def test_a_chain_is_one_kernel_within_the_tolerance(name, fn, shapes, dtype):
    torch.manual_seed(hash(name) % 1000)
    args = [torch.randn(s).to(dtype) for s in shapes]
    want = fn(*args)
    got = _compile(fn)(*args)
    assert _pointwise_calls() >= 1, f"{name}: no chain was fused"
    _close(got, want, fused_op_tol(dtype) * 2)


# Every op of these chains is exact in float32 (add, mul, div, ...), or eager rounds after it as the kernel does
# (bfloat16/float16), and each number is used as eager's kernel uses it (add and sub round it to the reduced
# dtype first, mul and div keep it in float32): the fused result is eager's, bit for bit.
EXACT_CHAINS = [
    ("arithmetic", lambda x, y: ((x + y) * 0.1 - y / 3.0 + 2.5) * x, [(3, 50), (50,)]),
    ("signs_and_extremes", lambda x, y: torch.maximum(-x, y).abs() - torch.minimum(x, y.relu()), [(8, 9), (8, 9)]),
    ("numbers_each_way", lambda x: (x + 0.1) * 0.1 - 0.3 / (x.abs() + 1.7) + 1 - x, [(513,)]),
    ("number_minus_tensor", lambda x: (0.7 - x) * 3.3 - (0.1 - x * x), [(77,)]),  # rsub: the number rounded first
    ("square_cube", lambda x: x ** 2 - x ** 3 * 0.5, [(100,)]),
    ("select", lambda x, y: torch.where(y > x, x - y, y * 3), [(40,), (40,)]),
]


@pytest.mark.default_isa
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name,fn,shapes", EXACT_CHAINS, ids=[c[0] for c in EXACT_CHAINS])
def test_exact_ops_are_bitwise_eager(name, fn, shapes, dtype):
    torch.manual_seed(1)
    args = [torch.randn(s).to(dtype) for s in shapes]
    want = fn(*args)
    got = _compile(fn)(*args)
    assert _pointwise_calls() >= 1
    assert torch.equal(got, want), f"{name} {dtype}: max diff {(got.double() - want.double()).abs().max().item()}"


@pytest.mark.parametrize("dtype", (torch.bfloat16, torch.float16), ids=str)
def test_upcast_chains_round_where_eager_rounds(dtype):
    # a float32 island inside a reduced-precision model: x.float() * w, rounded back once, as eager does
    def fn(x, w):
        return (x.float() * 0.5 + w.float()).tanh().to(dtype) * w

    x, w = torch.randn(4, 64).to(dtype), torch.randn(64).to(dtype)
    got = _compile(fn)(x, w)
    assert _pointwise_calls() == 1
    _close(got, fn(x, w), fused_op_tol(dtype))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_special_values_are_eagers(dtype):
    # NaN, infinities, signed zeros, subnormals, values that round to infinity in the reduced dtypes
    x = torch.tensor([float("nan"), float("inf"), -float("inf"), 0.0, -0.0, 1e-40, -3.0, 88.0, -104.0, 3e38,
                      3.3e38, -3.395e38, 65504.0, 65520.0, 1e-8, 0.5]).to(dtype)
    y = torch.tensor([1.0, float("nan"), 2.0, -0.0, 0.0, 1.0, float("inf"), 1.0, 2.0, 2.0,
                      1.01, 1.01, 1.0, 1.0, 1.0, float("nan")]).to(dtype)

    def fn(x, y):
        return (torch.maximum(x, y) + torch.minimum(x, y).relu(), torch.exp(x) * 1.0, torch.sigmoid(x) + 0.0,
                (x / y) * 1.0, torch.tanh(x) - 0.0, F.gelu(x, approximate="tanh") * 1.0, (x * 0.0).relu() - 1.0,
                x * y * 1.5, F.gelu(x) * 1.0)

    got = _compile(fn)(x, y)
    for g, w in zip(got, fn(x, y)):
        _close(g, w, fused_op_tol(dtype))
    assert _pointwise_calls() >= 1


@pytest.mark.default_isa
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_square_roots_by_pow_at_the_edges(dtype):
    # eager's pow takes sqrt / rsqrt / reciprocal for 0.5, -0.5, -1 in float32 and bfloat16, std::pow in float16:
    # they differ at -inf and -0.0 ((-inf) ** 0.5 = inf by pow, NaN by sqrt); found by a helper's adversarial run
    x = torch.tensor([-float("inf"), -0.0, 0.0, 4.0, float("inf"), -2.0, 0.25] * 5).to(dtype)

    def fn(x):
        return (x ** 0.5) * 2, (x ** -0.5) * 2, (x ** -1) * 2

    got = _compile(fn)(x)
    assert _pointwise_calls() >= 1
    for g, w in zip(got, fn(x)):
        nan = torch.isnan(w)
        assert torch.equal(torch.isnan(g), nan) and torch.equal(g[~nan], w[~nan])
        assert torch.equal(torch.signbit(g[~nan]), torch.signbit(w[~nan]))  # -0.0 and +0.0 too


@pytest.mark.default_isa
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_large_integers_are_converted_once_as_eager_converts_them(dtype):
    # an int over 2^53 went int -> double -> float (two roundings); eager converts it once (helper's finding)
    n = 2 ** 60 + 2 ** 36 + 1

    def fn(x):
        return (x * n) * 1.0 + 0.0 * x, (x + n) - x, (x - 3) * 7 + (2 ** 25 + 1)

    x = torch.tensor([1.0, -1.0, 0.5, 3.0]).to(dtype)
    got = _compile(fn)(x)
    assert _pointwise_calls() >= 1
    for g, w in zip(got, fn(x)):
        assert torch.equal(g, w), (g, w)


def test_empty_tensors():
    fn = lambda x, y: torch.tanh(x * y + 1)  # noqa: E731
    x, y = torch.randn(0, 5), torch.randn(5)
    got = _compile(fn)(x, y)
    assert got.shape == (0, 5) and _pointwise_calls() == 1


def test_the_option_switches_it_off_and_exact_mode_never_has_it():
    fn = lambda x: _gelu_new(x)  # noqa: E731
    x = torch.randn(3, 100)
    _compile(fn, pointwise_fusion=False)(x)
    assert _pointwise_calls() == 0
    torch._dynamo.reset()
    got = torch.compile(fn, backend="graphex", fullgraph=True, dynamic=False)(x)
    assert _pointwise_calls() == 0 and torch.equal(got, fn(x))


# ---- near misses: what the rule declines stays eager's kernel -----------------------------------------------

NEAR_MISSES = [
    ("alpha", lambda x, y: torch.add(x, y, alpha=0.5).tanh(), torch.float32, "aten.add.Tensor"),
    ("rounding_mode", lambda x, y: torch.div(x, y, rounding_mode="floor") * 2, torch.float32, "aten.div.Tensor_mode"),
    ("float64", lambda x, y: torch.tanh(x * y + 1), torch.float64, "aten.tanh.default"),
    ("integers", lambda x, y: (x * y + 1) * 3, torch.int32, "aten.mul.Tensor"),
]


@pytest.mark.parametrize("name,fn,dtype,stays", NEAR_MISSES, ids=[m[0] for m in NEAR_MISSES])
def test_near_misses_keep_eagers_op(name, fn, dtype, stays):
    x = (torch.randn(4, 16) * 4).to(dtype)
    y = (torch.randn(4, 16) * 4 + 9).to(dtype)
    got = _compile(fn)(x, y)
    targets = [str(n.target) for c in captures() for n in c.gm.graph.nodes if n.op == "call_function"]
    assert stays in targets, f"{name}: {stays} was fused away: {targets}"
    want = fn(x, y)
    if dtype in (torch.float64, torch.int32):
        assert torch.equal(got, want)
    else:
        _close(got, want, fused_op_tol(dtype) * 2)


def _onednn_takes(dtype) -> bool:
    """Whether eager's erf GELU of a contiguous tensor of this dtype is oneDNN's on this CPU (ATen's use_mkldnn)."""
    if not (torch.backends.mkldnn.is_available() and torch.backends.mkldnn.enabled):
        return False
    return {torch.bfloat16: bool(torch.ops.mkldnn._is_mkldnn_bf16_supported()),
            torch.float16: bool(torch.ops.mkldnn._is_mkldnn_fp16_supported())}.get(dtype, True)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_an_erf_gelu_alone_is_fused_where_it_pays(dtype):
    """chains._worth_alone: a lone erf GELU of a decode step's size runs gelu_erf where eager's is oneDNN's (whose
    per-call cost dominates at that size; which dtypes oneDNN takes depends on the CPU: bfloat16 is not oneDNN's on an
    AMD EPYC), its special values eager's own; one above _GELU_ALONE_MAX elements keeps eager's kernel (faster per
    element); one of a single element keeps eager's (not oneDNN's there: nothing to gain)."""
    from graphex.fusion.chains import _GELU_ALONE_MAX

    small = torch.randn(1, 1, 1024).to(dtype)
    small.view(-1)[:4] = torch.tensor([float("inf"), -float("inf"), float("nan"), -0.0])
    got = _compile(F.gelu)(small)
    assert _pointwise_calls() == (1 if _onednn_takes(dtype) else 0)
    _close(got, F.gelu(small), fused_op_tol(dtype))
    for x in (torch.randn(_GELU_ALONE_MAX + 1).to(dtype), torch.tensor([float("inf")]).to(dtype)):
        torch._dynamo.reset()
        got = _compile(F.gelu)(x)
        assert _pointwise_calls() == 0
        assert torch.equal(got, F.gelu(x))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("layout", ["contiguous", "strided", "one_element"])
def test_an_erf_gelus_special_inputs_are_eagers_own(dtype, layout):
    """Note [An erf GELU's special inputs are eager's own] (csrc/fused/pointwise.h): infinities, NaN, signed zeros and
    inputs at and past 2^32 up to float32's overflow, anywhere in a tile (first lane, a vector's last lane, the tail of a
    tile that is not a multiple of the vector width), each as eager's kernel gives it on this CPU, with oneDNN on and
    off: the first version gave Intel's oneDNN's NaN at +inf where this AMD EPYC's oneDNN (avx2) gives +inf."""
    specials = [float("inf"), -float("inf"), float("nan"), -0.0, 2.0 ** 32, -(2.0 ** 32), 1e20, -1e20, 1.7e38, -1.7e38,
                2e38, -2e38, 3e38, -3.4e38, 1e-40, 4294967040.0]
    x = torch.randn(2, 600) * 3
    for i, v in enumerate(specials):
        for j in (i, 15 + i, 31 - i % 16, 511 - i, 599 - i):
            x.view(-1)[j] = v
    x = x.to(dtype)
    fn = {"contiguous": lambda t: F.gelu(t + 0.0) * 2, "strided": lambda t: F.gelu(t[:, ::3] + 0.0) * 2,
          "one_element": lambda t: F.gelu(t.reshape(-1)[1:2] + 0.0) * 2}[layout]
    compiled = _compile(fn)
    for enabled in (True, False):
        with torch.backends.mkldnn.flags(enabled=enabled):
            for _ in range(2):
                got, want = compiled(x), fn(x)
                assert torch.equal(got.isnan(), want.isnan()) and torch.equal(got.isinf(), want.isinf()), (
                    layout, enabled, got.view(-1)[:16], want.view(-1)[:16])
                assert torch.equal(got.isinf() & (got > 0), want.isinf() & (want > 0))  # the infinity's sign too
                _close(got, want, fused_op_tol(dtype))
    assert _pointwise_calls() >= 1


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_the_erf_gelu_follows_the_kernel_eager_picks(dtype):
    """Note [The erf GELU as eager's kernels give it]: eager's gelu is oneDNN's only for a contiguous input of more
    than one element while oneDNN is on (its specials differ by CPU: NaN at +-inf on Intel's avx512_core JIT, +inf at
    +inf on AMD's avx2 JIT), else ATen's (+inf stays +inf). A strided and an
    expanded input, one element, and oneDNN switched off after compiling and back on: each as eager's (found by a
    helper: the chain always gave oneDNN's NaN)."""
    x = torch.randn(4, 16) * 3
    x[0, :8] = torch.tensor([float("inf"), -float("inf"), float("nan"), -0.0, 2e38, -2e38, 3e38, 1e-40])
    x = x.to(dtype)
    cases = [("strided", lambda t: F.gelu(t[:, ::2]) * 2, x), ("expanded", lambda t: F.gelu(t[:1].expand(4, 16)) * 2, x),
             ("contiguous", lambda t: F.gelu(t + 0.0) * 2, x), ("one_element", lambda t: F.gelu(t + 0.0) * 2, x[0, :1])]
    for name, fn, inp in cases:
        torch._dynamo.reset()
        compiled = _compile(fn)
        for enabled in (True, False, True):
            with torch.backends.mkldnn.flags(enabled=enabled):
                got, want = compiled(inp), fn(inp)
                assert torch.equal(got.isnan(), want.isnan()) and torch.equal(got.isinf(), want.isinf()), (
                    name, enabled, got.view(-1)[:8], want.view(-1)[:8])
                _close(got, want, fused_op_tol(dtype))
        assert _pointwise_calls() >= 1, name


def test_a_reduced_result_from_a_float32_operand_is_declined():
    # bfloat16 * float32 0-dim: eager rounds the float32 operand to bfloat16 first; the rule declines the node
    def fn(x, s):
        return (x * s).tanh() * 2

    x, s = torch.randn(5, 8).bfloat16(), torch.tensor(0.3)
    got = _compile(fn)(x, s)
    assert any(n.target is torch.ops.aten.mul.Tensor and n.args[1].op == "placeholder"
               for c in captures() for n in c.gm.graph.nodes if n.op == "call_function")
    _close(got, fn(x, s), fused_op_tol(torch.bfloat16) * 2)


def test_a_transposed_result_is_not_fused():
    # eager's mul keeps x.t()'s layout; the kernel writes contiguous results, so that node stays eager's
    def fn(x):
        return (x.t() * 2 + 1).reshape(-1)

    x = torch.randn(6, 10)
    got = _compile(fn)(x)
    assert torch.equal(got, fn(x))


def _graph(fn, *args):
    from torch.fx.experimental.proxy_tensor import make_fx

    gm = make_fx(fn, tracing_mode="fake")(*args)
    return gm


def test_a_member_used_outside_before_the_chain_ends_is_not_grouped():
    # a = x * 2 feeds mm before b = a + 1: the fused call (where b was) would come after mm, which needs a
    def fn(x, w):
        a = x * 2
        m = a @ w
        b = a + 1
        return m, b.tanh()

    gm = _graph(fn, torch.randn(4, 4), torch.randn(4, 4))
    groups = find_groups(gm.graph)
    names = [[str(n.target) for n in g] for g in groups]
    assert all("aten.mul.Tensor" not in g or "aten.add.Tensor" not in g for g in names), names
    assert ["aten.add.Tensor", "aten.tanh.default"] in names


def test_nothing_is_grouped_across_a_write():
    def fn(x, buf):
        a = buf * 2
        buf.add_(1)  # a write between the two reads: a must be computed before it
        return (a + 1).tanh() + buf

    gm = _graph(fn, torch.randn(8), torch.randn(8))
    order = {n: i for i, n in enumerate(gm.graph.nodes)}
    write = next(n for n in gm.graph.nodes if n.target is torch.ops.aten.add_.Tensor)
    for g in find_groups(gm.graph):
        assert not (order[g[0]] < order[write] < order[g[-1]]), [n.name for n in g]


def test_chains_in_a_model_and_its_gradients_are_left_alone():
    # training graphs: the pass runs on the forward and backward graphs AOTAutograd hands over, all float32
    torch.manual_seed(0)
    lin = torch.nn.Linear(16, 16)
    x = torch.randn(4, 16, requires_grad=True)

    def fn(x):
        return _gelu_new(lin(x)).sum()

    want = fn(x)
    want.backward()
    gx = x.grad.clone()
    x.grad = None
    got = _compile(fn)(x)
    got.backward()
    _close(got.detach(), want.detach(), 1e-5)
    _close(x.grad, gx, 1e-5)


# ---- generated chains -------------------------------------------------------------------------------------

_UNARY = [torch.tanh, torch.sigmoid, torch.relu, torch.neg, torch.abs, lambda t: t * 0.75, lambda t: t + 0.5,
          lambda t: F.gelu(t, approximate="tanh"), lambda t: F.gelu(t), lambda t: torch.erf(t), lambda t: t ** 2 * 0.1,
          lambda t: torch.sin(t), lambda t: 1 - t, lambda t: F.silu(t)]
_BINARY = [operator.add, operator.sub, operator.mul, torch.maximum, torch.minimum,
           lambda a, b: a / (b.abs() + 1), lambda a, b: torch.where(a > b, a, b * 0.5)]


def _random_chain(rng: random.Random):
    steps = []
    for _ in range(rng.randint(3, 12)):
        if rng.random() < 0.5:
            steps.append(("u", rng.randrange(len(_UNARY)), rng.randrange(1 << 30)))
        else:
            steps.append(("b", rng.randrange(len(_BINARY)), rng.randrange(1 << 30)))

    def fn(*inputs):
        values = list(inputs)
        for kind, k, pick in steps:
            if kind == "u":
                values.append(_UNARY[k](values[pick % len(values)]))
            else:
                values.append(_BINARY[k](values[pick % len(values)], values[(pick >> 7) % len(values)]))
        return values[-1], values[len(values) // 2]

    return fn


@pytest.mark.parametrize("seed", range(24))
def test_generated_chains_are_eagers_within_the_tolerance(seed):
    rng = random.Random(seed)
    dtype = DTYPES[seed % 3]
    shapes = rng.choice([[(3, 33), (33,)], [(2, 1, 20), (5, 20)], [(1000,), ()], [(4, 4), (4, 4)]])
    torch.manual_seed(seed)
    args = [torch.randn(s).to(dtype) for s in shapes]
    fn = _random_chain(rng)
    want = fn(*args)
    got = _compile(fn)(*args)
    for g, w in zip(got, want):
        # a chain's ops each within the per-op tolerance; a last-bit difference in one op carries through the rest
        _close(g, w, fused_op_tol(dtype) * 4)


# ---- the kernel refuses a bad program (an exported one is read from a file) ---------------------------------

def test_a_bad_program_is_an_error_naming_what_is_wrong():
    ops, dtypes = kernel_tables()
    x = torch.randn(8)
    f32 = dtypes[torch.float32]
    pw = torch.ops.graphex_fused.pointwise
    with pytest.raises(RuntimeError, match="no opcode 999"):
        pw([x], [999, 1, 0, 0, 0], [], [1, f32])
    with pytest.raises(RuntimeError, match="writes slot 0"):
        pw([x], [ops["tanh"], 0, 0, 0, 0], [], [0, f32])
    with pytest.raises(RuntimeError, match="neither a slot nor one of the 0 constants"):
        pw([x], [ops["add"], 1, 0, -1, 0], [], [1, f32])
    with pytest.raises(RuntimeError, match="not 5 per instruction"):
        pw([x], [ops["tanh"], 1, 0], [], [1, f32])
    with pytest.raises(RuntimeError, match="dtype number 9"):
        pw([x], [ops["tanh"], 1, 0, 0, 0], [], [1, 9])
    with pytest.raises(RuntimeError, match="reads slot 7"):
        pw([x], [ops["tanh"], 1, 0, 0, 0], [], [7, f32])
    with pytest.raises(RuntimeError, match="operand 0 is 300"):
        pw([x], [ops["tanh"], 1, 300, 0, 0], [], [1, f32])
    out = pw([x], [ops["tanh"], 1, 0, 0, 0], [], [1, f32])
    _close(out[0], torch.tanh(x), fused_op_tol(torch.float32))


# ---- export: the Python-free runner runs the chain ------------------------------------------------------------

def test_graphex_run_runs_an_exported_chain(tmp_path):
    import os
    import subprocess

    from graphex.exporting import load_safetensors, safetensors_bytes

    from conftest import ROOT

    runner = os.path.join(os.environ.get("GRAPHEX_BUILD_DIR") or os.path.join(ROOT, "build", "py"), "graphex-run")
    assert os.path.exists(runner), "graphex-run is not built: make build"

    class Mlp(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc, self.out = torch.nn.Linear(16, 64), torch.nn.Linear(64, 16)

        def forward(self, x):
            return x + self.out(_gelu_new(self.fc(x)))

    torch.manual_seed(0)
    model = Mlp().eval()
    x = torch.randn(2, 16)
    path = graphex.export(model, (x,), tmp_path / "chain.graphex", options=FUSED)
    program = open(os.path.join(path, "program.gxp"), "rb").read()
    assert b"graphex_fused" in program and b"pointwise" in program, "the exported program has no chain"
    (tmp_path / "in.safetensors").write_bytes(safetensors_bytes({"0": x}))
    proc = subprocess.run([runner, path, "--inputs", str(tmp_path / "in.safetensors"),
                           "--output", str(tmp_path / "out.safetensors")], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    with torch.no_grad():
        in_process = _compile(model)(x)
        want = model(x)
    assert _pointwise_calls() == 1
    got = load_safetensors(tmp_path / "out.safetensors")["0"]
    assert torch.equal(got, in_process)  # the same kernels, in and out of Python
    _close(got, want, fused_op_tol(torch.float32) * 2)
