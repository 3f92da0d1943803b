"""Device graphs (graphex/runtime/device_graphs.py) on the simulated accelerator gxsim (graphex.testing.sim): one replay per
step, every result bit for bit eager's on the same device (on gxsim that is the CPU's eager result: its kernels are
the CPU's, test_sim_device.py), inputs written in place with no copy, outputs never overwritten, recaptures on a
moved buffer, capture failures named and answered by running without a graph.

GRAPHEX_TEST_DEVICE=cuda runs the same tests on a real GPU (scripts/gpu_check.py does). gxsim's counters (launches
outside a replay, the pool a tensor belongs to, a graph's dump) exist only there: on another device the assertions
on them are skipped, and the runner's own capture and replay counts and the bitwise results remain."""

from __future__ import annotations

import os
import warnings

import pytest
import torch
from torch import nn

import graphex
from graphex.testing import sim

from conftest import captures

DEV = os.environ.get("GRAPHEX_TEST_DEVICE") or sim.enable()
ON_SIM = DEV == sim.enable()
KEY = "PrivateUse1" if ON_SIM else DEV.upper()  # the dispatch key a custom op's device kernel is registered under


def reset_stats() -> None:
    if ON_SIM:
        sim.reset_stats()


def device_stats() -> dict | None:
    """gxsim's counters since reset_stats(); None on another device (the assertions on them are gxsim's)."""
    return sim.stats() if ON_SIM else None


def capturing() -> bool:
    return sim.is_current_stream_capturing() if ON_SIM else torch.cuda.is_current_stream_capturing()


def same(got: torch.Tensor, want: torch.Tensor) -> bool:
    return torch.equal(got.cpu(), want.cpu())


def compiled(fn, dynamic=False, **options):
    return torch.compile(fn, backend="graphex", fullgraph=True, dynamic=dynamic, options=options)


def runner_of(before: set[int]):
    (graph,) = [g for g in captures() if id(g) not in before]
    assert graph.device_graphs is not None, "the compiled graph did not get device graphs"
    return graph.device_graphs


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(16, 16)
        self.norm = nn.LayerNorm(16)

    def forward(self, x):
        return torch.softmax(self.norm(self.lin(x)).relu() * 2.5, dim=-1)


def test_a_step_is_one_replay_and_equals_eager():
    torch.manual_seed(0)
    ref = Block().eval()
    dev = Block().eval()
    dev.load_state_dict(ref.state_dict())
    dev.to(DEV)
    ref.to(DEV)
    before = {id(g) for g in captures()}
    step = compiled(dev)
    xs = [torch.randn(4, 16) for _ in range(5)]
    with torch.no_grad():
        outs = [step(x.to(DEV)) for x in xs]  # call 1 runs on the engine, then captures; 2-5 replay
        runner = runner_of(before)
        assert runner.captures == 1 and runner.replays == 4
        reset_stats()
        last = step(xs[0].to(DEV))
        stats = device_stats()
        want = [ref(x.to(DEV)) for x in xs]
    if stats is not None:
        assert stats["graph_replays"] == 1 and stats["captures"] == 0
        # outside the replay: the input copied in, the output copied out (and the .to() above)
        assert stats["kernel_launches"] <= 3, stats
    for got, w in zip(outs, want):
        assert same(got, w)
    assert same(last, want[0])


@pytest.mark.parametrize("dynamic", [False, True])
def test_outputs_held_across_calls_and_signatures_are_never_overwritten(dynamic):
    """Note [Device graph outputs are never overwritten]: with dynamic=True two signatures' device graphs share one
    pool (reuse_graph_pool_in_same_fx); every held output stays what eager computed for its own call."""
    f = compiled(lambda x, y: (x @ y).tanh() + x.sum(), dynamic=dynamic)
    torch.manual_seed(1)
    calls = [(torch.randn(3, 5), torch.randn(5, 2)) if i % 2 else (torch.randn(6, 5), torch.randn(5, 4))
             for i in range(10)]
    calls = [(x.to(DEV), y.to(DEV)) for x, y in calls]
    held = [f(x, y) for x, y in calls]
    for (x, y), got in zip(calls, held):
        assert same(got, (x @ y).tanh() + x.sum())


def test_a_kv_cache_is_written_in_place_with_no_copy():
    """An input the program writes is captured on the caller's own buffer: the replay writes the caller's cache."""
    def step(x, pos, cache):
        cache.index_copy_(0, pos, x)
        return cache.sum(0) * 2

    f = compiled(step)
    cache_dev, cache_ref = torch.zeros(8, 4, device=DEV), torch.zeros(8, 4, device=DEV)
    before = {id(g) for g in captures()}
    for i in range(6):
        x, pos = torch.full((1, 4), float(i + 1)), torch.tensor([i])
        x_dev, pos_dev = x.to(DEV), pos.to(DEV)
        reset_stats()
        out = f(x_dev, pos_dev, cache_dev)
        stats = device_stats()
        want = step(x.to(DEV), pos.to(DEV), cache_ref)
        assert same(out, want) and same(cache_dev, cache_ref), f"step {i}"
        if i >= 2 and stats is not None:  # a replay: x and pos copied in, the output copied out; never the cache (a model's GBs)
            assert stats["graph_replays"] == 1 and stats["kernel_launches"] == 3, (i, stats)
    runner = runner_of(before)
    assert list(runner.pinned.values()) == ["written by aten::index_copy_"], runner.pinned


def test_a_cache_at_a_new_address_recaptures(caplog):
    def step(x, cache):
        cache.add_(x)
        return cache * 1

    f = compiled(step)
    a, b = torch.zeros(4, device=DEV), torch.zeros(4, device=DEV)
    before = {id(g) for g in captures()}
    for _ in range(3):
        f(torch.ones(4, device=DEV), a)
    runner = runner_of(before)
    captured = runner.captures
    out = f(torch.ones(4, device=DEV), b)  # another cache tensor: the graph must write b, not a
    assert torch.equal(b.cpu(), torch.ones(4)) and torch.equal(a.cpu(), torch.full((4,), 3.0))
    assert torch.equal(out.cpu(), torch.ones(4))
    f(torch.ones(4, device=DEV), b)
    assert torch.equal(b.cpu(), torch.full((4,), 2.0)) and runner.captures == captured + 1


def test_a_replaced_parameter_recaptures():
    torch.manual_seed(2)
    m = nn.Linear(4, 3).to(DEV)
    f = compiled(m)
    x = torch.randn(2, 4)
    with torch.no_grad():
        for _ in range(3):
            f(x.to(DEV))
        m.weight = nn.Parameter(torch.randn(3, 4, device=DEV))
        got = f(x.to(DEV))
        want = torch.nn.functional.linear(x.to(DEV), m.weight, m.bias)
    assert same(got, want)


@pytest.mark.parametrize("clone_input", [True, False])
def test_new_input_tensors_each_call(clone_input):
    f = compiled(lambda x: x * 3 - 1, clone_input=clone_input)
    torch.manual_seed(3)
    xs = [torch.randn(5) for _ in range(5)]
    for x in xs:
        x = x.to(DEV)
        assert same(f(x), x * 3 - 1)


def test_capture_limit_then_the_engine_with_one_warning():
    f = compiled(lambda x: x + 1, dynamic=True, capture_limit=2)  # one program, a device graph per size
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        for n in (2, 3, 4, 5):
            for _ in range(3):
                assert torch.equal(f(torch.ones(n, device=DEV)).cpu(), torch.full((n,), 2.0))
    limit = [w for w in seen if "capture_limit" in str(w.message)]
    assert len(limit) == 1, [str(w.message) for w in seen]
    assert "options={'capture_limit': N}" in str(limit[0].message)
    # the printed fix, applied: a higher limit captures every size, with no warning
    g = compiled(lambda x: x + 2, dynamic=True, capture_limit=4)
    before = {id(c) for c in captures()}
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        for n in (2, 3, 4, 5):
            for _ in range(3):
                assert torch.equal(g(torch.ones(n, device=DEV)).cpu(), torch.full((n,), 3.0))
    assert not [w for w in seen if "capture_limit" in str(w.message)]
    assert runner_of(before).captures == 4


def test_a_host_sync_in_a_custom_op_breaks_the_capture_and_falls_back_named():
    """A custom op whose device kernel syncs with the host (.item()) cannot be captured: graphex warns naming the
    op and runs that signature on the engine, with the right results."""
    lib = torch.library.Library("gx_devgraph", "DEF")
    lib.define("host_sync(Tensor x) -> Tensor")
    lib.impl("host_sync", lambda x: x * float(x.sum().item()), KEY)
    lib.impl("host_sync", lambda x: x * float(x.sum().item()), "CPU")
    lib.impl("host_sync", lambda x: torch.empty_like(x), "Meta")
    f = compiled(lambda x: torch.ops.gx_devgraph.host_sync(x + 1))
    x = torch.arange(4.0)
    with pytest.warns(graphex.GraphexWarning, match="could not be captured.*host_sync|host_sync.*could not be captured"):
        outs = [f(x.to(DEV)) for _ in range(3)]
    for out in outs:
        assert torch.equal(out.cpu(), (x + 1) * float((x + 1).sum()))
    # the device is usable after the failed capture
    assert torch.equal((torch.ones(2, device=DEV) * 2).cpu(), torch.full((2,), 2.0))


def test_the_cpu_engine_gets_no_device_graphs():
    before = {id(g) for g in captures()}
    f = compiled(lambda x: x + 1)
    f(torch.ones(3))
    (graph,) = [g for g in captures() if id(g) not in before]
    assert graph.device_graphs is None


@pytest.mark.parametrize("custom_ops", [True, False])
def test_the_shipped_decoder_decodes_as_one_replay_per_step_bit_for_bit(custom_ops):
    """The repo's decoder (its custom ops: RMSNorm, rotary, the in-place KV-cache update) through torch.compile on
    gxsim: every step after the first is one replay, the KV cache is written in place (never copied), and every
    step's logits and both caches are bit for bit eager's on the CPU."""
    from examples.models.decoder import DecoderConfig, build_decoder

    cfg = DecoderConfig(layers=2, custom_ops=custom_ops)
    ref = build_decoder(cfg)
    dev = build_decoder(cfg).to(DEV)
    k_ref, v_ref = ref.new_cache()
    k_dev, v_dev = k_ref.clone().to(DEV), v_ref.clone().to(DEV)
    ref.to(DEV)
    k_ref, v_ref = k_ref.to(DEV), v_ref.to(DEV)
    step = compiled(dev)
    token = torch.tensor([[1]])
    with torch.no_grad():
        for i in range(5):
            pos = torch.tensor([i])
            token_dev, pos_dev = token.to(DEV), pos.to(DEV)
            reset_stats()
            got = step(token_dev, pos_dev, k_dev, v_dev)
            stats = device_stats()
            want = ref(token_dev, pos_dev, k_ref, v_ref)
            assert same(got, want), f"step {i}: logits differ"
            assert same(k_dev, k_ref) and same(v_dev, v_ref), f"step {i}: cache differs"
            if i >= 2 and stats is not None:  # token and pos copied in, the logits copied out: 3 launches, the whole step one replay
                assert stats["graph_replays"] == 1 and stats["kernel_launches"] == 3, (i, stats)
            token = want.argmax(-1).cpu()


def test_graphs_of_two_functions_sharing_one_pool_keep_their_outputs():
    """use_graph_pool: one pool for the device graphs of two compiled functions, called in alternation."""
    pool = sim.graph_pool_handle() if ON_SIM else torch.cuda.graph_pool_handle()
    f = compiled(lambda x: (x * 2).exp(), use_graph_pool=pool)
    g = compiled(lambda x: (x + 3).sin() * x, use_graph_pool=pool)
    torch.manual_seed(4)
    xs = [torch.randn(8) for _ in range(6)]
    before = {id(c) for c in captures()}
    held = [(f(x.to(DEV)), g(x.to(DEV))) for x in xs]
    runners = [c.device_graphs for c in captures() if id(c) not in before]
    assert len(runners) == 2
    for runner in runners:
        (entry,) = runner.graphs.values()
        if ON_SIM:
            assert sim.pool_of(entry.outputs[0]) == pool, "the graph did not allocate from use_graph_pool's pool"
    for x, (a, b) in zip(xs, held):
        x = x.to(DEV)
        assert same(a, (x * 2).exp()) and same(b, (x + 3).sin() * x)


def _outputs_sharing_memory(x):
    y = x * 2
    h = x.exp()
    return y, y.view(-1), y[1:], h[0], h[1:], x + 1


def test_outputs_that_share_memory_in_eager_share_it_after_a_replay():
    """Note [Outputs that share memory are copied together]: a write into one output shows through the outputs that
    are its views, and outputs that view one intermediate view one copy of it; each is a view where eager's is."""
    c = compiled(_outputs_sharing_memory)
    before = {id(g) for g in captures()}
    with torch.no_grad():
        for call in range(4):  # the engine, the capture, then replays
            x = torch.arange(12.0).view(3, 4)
            got, want = c(x.to(DEV)), _outputs_sharing_memory(x)
            for i, (g, w) in enumerate(zip(got, want)):
                assert same(g, w), (call, i)
                assert g._is_view() == w._is_view(), (call, i)
            got[0].zero_(), want[0].zero_()
            got[3].fill_(5), want[3].fill_(5)
            for i, (g, w) in enumerate(zip(got, want)):
                assert same(g, w), f"call {call}: output {i} after the caller wrote outputs 0 and 3"
            assert got[1]._base is got[0] and got[2]._base is got[0]
    assert runner_of(before).replays >= 2


def test_custom_ops_of_each_registration_style_replay_inside_the_graph():
    """custom_op + register_fake (in place, on a cache: zero copies) and Library define/impl + Meta with a
    PrivateUse1 kernel, inside one device graph; the C++ TORCH_LIBRARY style is the shipped decoder's test above."""
    @torch.library.custom_op("gx_devgraph2::scaled_add_", mutates_args=("cache",))
    def scaled_add_(cache: torch.Tensor, x: torch.Tensor, alpha: float) -> None:
        cache.add_(x, alpha=alpha)

    @scaled_add_.register_fake
    def _(cache, x, alpha):
        return None

    lib = torch.library.Library("gx_devgraph2", "DEF")
    lib.define("twice_plus(Tensor x) -> Tensor")
    lib.impl("twice_plus", lambda x: x * 2 + 1, KEY)
    lib.impl("twice_plus", lambda x: x * 2 + 1, "CPU")
    lib.impl("twice_plus", lambda x: torch.empty_like(x), "Meta")

    def step(x, cache):
        torch.ops.gx_devgraph2.scaled_add_(cache, x, 0.5)
        return torch.ops.gx_devgraph2.twice_plus(cache)

    f = compiled(step)
    cache_dev, cache_ref = torch.zeros(6, device=DEV), torch.zeros(6, device=DEV)
    torch.manual_seed(5)
    for i in range(4):
        x = torch.randn(6)
        x_dev = x.to(DEV)
        reset_stats()
        out = f(x_dev, cache_dev)
        stats = device_stats()
        want = step(x.to(DEV), cache_ref)
        assert same(out, want) and same(cache_dev, cache_ref), f"call {i}"
        if i >= 2 and stats is not None:  # x copied in, the output copied out; the cache written where it is
            assert stats["graph_replays"] == 1 and stats["kernel_launches"] == 2, (i, stats)


def test_the_graph_class_is_torchs_generic_one_where_torch_has_it():
    """Note [Which graph class a device uses]: torch.accelerator.Graph (torch >= 2.12 here, through gxsim's
    REGISTER_GRAPH_IMPL), else the backend module's own class (torch.gxsim.GXSIMGraph, as torch.cuda.CUDAGraph)."""
    from graphex import compat

    cls = compat._device_graph_class(DEV)
    if hasattr(torch.accelerator, "Graph"):
        assert cls is torch.accelerator.Graph, torch.__version__
    else:
        assert cls is (sim.Graph if ON_SIM else torch.cuda.CUDAGraph), torch.__version__


def test_a_tensor_marked_static_is_captured_on_its_own_memory():
    """torch._dynamo.mark_static_address: like a parameter, read where it is (no copy per call), address checked."""
    table = torch.randn(16, device=DEV)
    torch._dynamo.mark_static_address(table)
    f = compiled(lambda x, t: x * t)
    x = torch.randn(16)
    x_dev = x.to(DEV)
    for i in range(3):
        reset_stats()
        out = f(x_dev, table)
        stats = device_stats()
    assert same(out, x_dev * table)
    if stats is not None:  # x in, the output out; not table
        assert stats["graph_replays"] == 1 and stats["kernel_launches"] == 2, stats


def test_a_graph_with_a_cpu_tensor_input_is_not_captured():
    """A CPU scalar's value would be baked into the capture; such a graph runs on the engine, right each call."""
    f = compiled(lambda x, s: x * s)
    x = torch.ones(3, device=DEV)
    before = {id(g) for g in captures()}
    for i in range(4):
        assert torch.equal(f(x, torch.tensor(float(i))).cpu(), torch.full((3,), float(i)))
    (graph,) = [g for g in captures() if id(g) not in before]
    assert graph.device_graphs is None


def test_clone_input_false_copies_a_new_address_into_the_captured_buffer_once_per_call():
    f = compiled(lambda x: x + 1, clone_input=False)
    before = {id(g) for g in captures()}
    first = torch.zeros(4, device=DEV)
    f(first)
    f(first)
    runner = runner_of(before)
    for i in range(5):
        x = torch.full((4,), float(i), device=DEV)
        assert torch.equal(f(x).cpu(), torch.full((4,), i + 1.0))
    ((entry,),) = [list(runner.graphs.values())]
    assert entry.copied == [0] and not entry.addresses, (entry.copied, entry.addresses)


def test_calls_from_several_threads_each_get_their_own_result():
    """Note [One replay at a time]: four threads calling one compiled graph with their own inputs."""
    import threading

    f = compiled(lambda x: (x * 3).sin() + x)
    torch.manual_seed(6)
    xs = [torch.randn(64) for _ in range(4)]
    f(xs[0].to(DEV))
    f(xs[0].to(DEV))  # captured
    wrong = []

    def worker(x):
        x_dev = x.to(DEV)
        want = ((x_dev * 3).sin() + x_dev).cpu()
        for _ in range(200):
            if not torch.equal(f(x_dev).cpu(), want):
                wrong.append(1)

    threads = [threading.Thread(target=worker, args=(x,)) for x in xs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not wrong, f"{len(wrong)} of 800 calls returned another thread's result"


def test_force_recapture_captures_before_every_call_and_stays_equal_to_eager():
    """npugraph_ex's force_recapture: no call replays an earlier capture; results (held ones too) equal eager."""
    torch.manual_seed(3)
    w = torch.randn(8, 8)
    f = compiled(lambda x, w: (x @ w).sigmoid() * 3, force_recapture=True)
    before = {id(g) for g in captures()}
    xs = [torch.randn(2, 8) for _ in range(5)]
    wd = w.to(DEV)
    held = [f(x.to(DEV), wd) for x in xs]
    runner = runner_of(before)
    assert runner.captures == 4 and runner.replays == 4, (runner.captures, runner.replays)  # call 1: the engine
    assert len(runner.graphs) == 1  # one signature: each capture replaced the last, no growth toward capture_limit
    for x, got in zip(xs, held):
        assert same(got, (x.to(DEV) @ wd).sigmoid() * 3)


# ---- side streams (Note [Side streams in a program]) -------------------------------------------------------

needs_traced_streams = pytest.mark.skipif(
    not graphex.compat.traces_side_streams(),
    reason=f"side streams are lowered as fork/join from torch 2.13 (compat.traces_side_streams); this is {torch.__version__}")


def _launches_by_stream(runner) -> dict[int, int]:
    """stream id -> launches recorded on it, from the one captured graph's dump."""
    import re
    (entry,) = [e for e in runner.graphs.values() if hasattr(e, "graph")]
    graph = entry.graph._graph
    text = graph.debug_dump(None) if isinstance(graph, sim.Graph) else _dump_accelerator_graph(graph)
    counts: dict[int, int] = {}
    for stream in re.findall(r"\[stream (\d+)\]", text):
        counts[int(stream)] = counts.get(int(stream), 0) + 1
    return counts


def _dump_accelerator_graph(graph) -> str:
    import os
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "graph.txt")
        graph.debug_dump(path)
        with open(path) as f:
            return f.read()


def _fork_join(side):
    def f(x, w):
        y = x @ w
        side.wait_stream(torch.accelerator.current_stream())
        with side:
            z = (y * 2).sin()        # forked: runs on the side stream, recorded into the same graph
        u = y.cos()                  # meanwhile on the calling stream
        torch.accelerator.current_stream().wait_stream(side)
        return z + u
    return f


def _events(side):
    def f(x, w):
        done = torch.Event()
        y = x @ w
        side.wait_stream(torch.accelerator.current_stream())
        with side:
            z = y.sigmoid() * 3
            done.record()
        u = y.tanh()
        done.wait()
        return z - u
    return f


def _stream_made_inside(side):
    def f(x, w):
        s = torch.Stream()
        y = x @ w
        s.wait_stream(torch.accelerator.current_stream())
        with s:
            z = y.exp()
        torch.accelerator.current_stream().wait_stream(s)
        return z / 2
    return f


@pytest.mark.parametrize("spelling", [_fork_join, _events, _stream_made_inside])
def test_side_stream_work_is_captured_as_fork_join_and_equals_eager(spelling):
    """Work the function runs on a side stream is forked from the capture stream and joined back: it is recorded
    into the same device graph (on its own stream), each later call is one replay, and every result is bit for bit
    eager's, for new inputs each call. Before torch 2.13 (compat.traces_side_streams) the work runs in order on the
    calling stream, as aot_eager runs it: one replay per call and the same results, on one stream."""
    side = torch.Stream(device=DEV)
    fn = spelling(side)
    torch.manual_seed(0)
    w = torch.randn(8, 8)
    xs = [torch.randn(4, 8) for _ in range(5)]
    want = {_fork_join: lambda x, w: ((x @ w) * 2).sin() + (x @ w).cos(),
            _events: lambda x, w: (x @ w).sigmoid() * 3 - (x @ w).tanh(),
            _stream_made_inside: lambda x, w: (x @ w).exp() / 2}[spelling]
    before = {id(g) for g in captures()}
    f = compiled(fn)
    wd = w.to(DEV)
    entered = torch.accelerator.current_stream(torch.device(DEV))
    outs = [f(x.to(DEV), wd) for x in xs[:3]]  # engine, capture + replay, replay
    runner = runner_of(before)
    assert runner.captures == 1 and runner.replays == 2
    reset_stats()
    outs.append(f(xs[3].to(DEV), wd))
    stats = device_stats()
    assert stats is None or (stats["graph_replays"] == 1 and stats["captures"] == 0), stats
    outs.append(f(xs[4].to(DEV), wd))
    assert torch.accelerator.current_stream(torch.device(DEV)) == entered, "the call left the caller on another stream"
    for x, out in zip(xs, outs):
        assert same(out, want(x.to(DEV), wd)), spelling.__name__
    if not graphex.compat.traces_side_streams():
        return
    if ON_SIM:  # gxsim's dump names each launch's stream
        by_stream = _launches_by_stream(runner)
        assert len(by_stream) == 2, f"expected the work on two streams of one graph, got {by_stream}"
        assert min(by_stream.values()) >= 1
    (graph,) = [g for g in captures() if id(g) not in before]
    ops = [n.op for n in graph.lowered.program.nodes if hasattr(n, "op")]
    # a tensor made on one stream and read on the other is recorded as used there (its memory is not reused early)
    assert "streams::record_stream" in ops and ops.count("streams::fork") == 1 and ops.count("streams::join") == 1, ops


@needs_traced_streams  # before 2.13 the work runs on the calling stream: nothing is forked (test above)
def test_a_side_stream_never_joined_back_falls_back_named_and_stays_right():
    """A fork the function never joins cannot end a capture (CUDA: cudaErrorStreamCaptureUnjoined): graphex warns
    with the fix (wait for the side stream before returning) and runs that signature on the engine, right."""
    side = torch.Stream(device=DEV)

    def f(x):
        y = x * 2
        side.wait_stream(torch.accelerator.current_stream())
        with side:
            z = y + 1
        return z * 3  # no wait on `side`: a race in eager on a real device, an unjoined fork in a capture

    g = compiled(f)
    x = torch.arange(4.0)
    with pytest.warns(graphex.GraphexWarning, match="not joined back.*wait_stream"):
        outs = [g(x.to(DEV)) for _ in range(3)]
    for out in outs:
        assert torch.equal(out.cpu(), (x * 2 + 1) * 3)
    assert not capturing()

    def fixed(x):  # the printed fix: the calling stream waits for the side stream before returning
        y = x * 2
        side.wait_stream(torch.accelerator.current_stream())
        with side:
            z = y + 1
        torch.accelerator.current_stream().wait_stream(side)
        return z * 3

    before = {id(c) for c in captures()}
    h = compiled(fixed)
    with warnings.catch_warnings():
        warnings.simplefilter("error", graphex.GraphexWarning)
        outs = [h(x.to(DEV)) for _ in range(3)]
    assert runner_of(before).captures == 1 and runner_of(before).replays == 2
    for out in outs:
        assert torch.equal(out.cpu(), (x * 2 + 1) * 3)


def _ops_by_stream(program) -> list[tuple[str, int | None]]:
    """(op, the stream it runs on: a side stream's index, None for the entry stream) for each op of a program."""
    stream, out = None, []
    for node in program.nodes:
        op = getattr(node, "op", None)
        if op == "streams::fork":
            stream = node.args[1]
        elif op == "streams::join":
            stream = None
        elif op is not None and not op.startswith("streams::"):
            out.append((op, stream))
    return out


@needs_traced_streams
def test_passes_keep_each_call_on_its_stream():
    """A node a pass makes runs on the stream of the node it replaces, and CSE never merges a call on a side stream
    with the same call on the entry stream: the entry stream's `x.sin()` before the join would otherwise read the
    side stream's result without waiting for it (a race on a real device, invisible on gxsim's synchronous
    streams, so the program itself is checked)."""
    side = torch.Stream(device=DEV)

    def f(x):
        side.wait_stream(torch.accelerator.current_stream())
        with side:
            b = x.sin() * 2
            b[1:3] = x[:2].cos()  # functionalized to slice_scatter, which the passes rebuild
        a = x.sin() + 1           # the same call as the side stream's, on the entry stream before the join
        torch.accelerator.current_stream().wait_stream(side)
        return a + b

    before = {id(g) for g in captures()}
    g = compiled(f)
    x = torch.randn(4, device=DEV)
    for _ in range(3):
        assert same(g(x), f(x))
    (graph,) = [c for c in captures() if id(c) not in before]
    ops = _ops_by_stream(graph.lowered.program)
    side_index = next(s for _, s in ops if s is not None)
    on_side = [op for op, s in ops if s == side_index]
    assert ("aten::sin", None) in ops and ("aten::sin", side_index) in ops, ops  # not merged across streams
    # the write into b, made by a pass (slice_scatter, or the slice + copy_ reinplacing makes of it on torch 2.14),
    # is on the side stream, and nothing of it on the entry stream
    writes = {"aten::slice_scatter", "aten::copy_"}
    assert "aten::cos" in on_side and writes & set(on_side), ops
    assert not writes & {op for op, s in ops if s is None}, ops
    assert ops[:len(on_side)] == [(op, side_index) for op in on_side], ops  # the whole `with side:` block first


@needs_traced_streams
def test_side_streams_are_neither_cached_nor_exported(tmp_path):
    """A program with side streams names Dynamo's per-call table of stream objects, which a fresh process's cache
    hit or graphex-run would not have: cache_compile runs it compiled and writes nothing, saying why; export
    refuses, naming it."""
    side = torch.Stream(device=DEV)

    def f(x):
        y = x * 2
        side.wait_stream(torch.accelerator.current_stream())
        with side:
            z = y.sin()
        torch.accelerator.current_stream().wait_stream(side)
        return z + 1

    x = torch.arange(4.0, device=DEV)
    cached = graphex.inference.cache_compile(f, cache_dir=str(tmp_path / "cache"))
    with pytest.warns(graphex.GraphexWarning, match="cannot be cached: the function runs work on side streams"):
        out = cached(x)
    assert same(out, f(x)) and same(cached(x), f(x))
    assert cached.stats["writes"] == 0, cached.stats
    with pytest.raises(graphex.ExportError, match="side streams"):
        graphex.export(f, (x,), str(tmp_path / "f.graphex"))
    assert not (tmp_path / "f.graphex").exists()


def test_a_custom_op_that_leaves_another_stream_current_raises():
    """A program must return on the stream it was called on: a custom op that switches streams and does not switch
    back is refused at the capture with an error that names both streams and the fix, and the caller's stream is
    restored. The fix, applied (the op forks and joins its stream), captures, and its work is in the graph."""
    side = torch.Stream(device=DEV)
    lib = torch.library.Library("gx_devgraph_stream", "DEF")
    lib.define("switches(Tensor x) -> Tensor")

    def switches(x):
        torch.accelerator.set_stream(side)
        return x + 1

    lib.impl("switches", switches, KEY)
    lib.impl("switches", lambda x: torch.empty_like(x), "Meta")
    f = compiled(lambda x: torch.ops.gx_devgraph_stream.switches(x * 2))
    dev = torch.device(DEV)
    entered = torch.accelerator.current_stream(dev)
    x = torch.arange(3.0, device=DEV)
    f(x)  # the first call runs on the engine (and this op leaves `side` current, as it would in eager)
    torch.accelerator.set_stream(entered)
    with pytest.raises(RuntimeError, match=r"entered on stream \d+ .* returned on stream \d+.*fork and join it"):
        f(x)
    assert torch.accelerator.current_stream(dev) == entered
    assert not capturing()

    def restores(x):  # the printed fix: the op forks and joins its stream, and the stream it found is current again
        found = torch.accelerator.current_stream(x.device)
        side.wait_stream(found)
        with side:
            out = x + 1
        found.wait_stream(side)
        return out

    lib.define("restores(Tensor x) -> Tensor")
    lib.impl("restores", restores, KEY)
    lib.impl("restores", lambda x: torch.empty_like(x), "Meta")
    before = {id(c) for c in captures()}
    g = compiled(lambda x: torch.ops.gx_devgraph_stream.restores(x * 2))
    for _ in range(3):
        assert same(g(x), x * 2 + 1)
    assert torch.accelerator.current_stream(dev) == entered
    assert runner_of(before).captures == 1
    del lib


@pytest.mark.skipif(not ON_SIM, reason="runs scripts/gpu_check.py on gxsim; on a GPU, gpu_check.py is what runs this file")
def test_the_gpu_check_script_passes_its_checks_on_gxsim(tmp_path):
    """scripts/gpu_check.py (make gpu-check) is only run on a lent GPU: its checks run here on gxsim so it is ready,
    and each check either passes or says why it was skipped (NCCL needs cuda)."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    out = tmp_path / "gpu_check.json"
    proc = subprocess.run([sys.executable, str(root / "scripts" / "gpu_check.py"), "--device", "gxsim", "--quick",
                           "--checks-only", "--out", str(out)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(out.read_text())
    assert report["failed"] == [] and len(report["checks"]) == 6, report
    skipped = {name: c["skipped"] for name, c in report["checks"].items() if "skipped" in c}
    expected = ["1-GPU NCCL group: collectives in the graph", "the device tests (test_device_graphs.py) on this device"]
    assert list(skipped) == expected, skipped
