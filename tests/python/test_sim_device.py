"""The simulated accelerator gxsim (graphex.testing.sim, csrc/testing/sim): eager is bit for bit the
CPU, streams and events, capture and replay with CUDA graphs' semantics, graph memory pools, and
what breaks a capture."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from graphex.testing import sim

DEV = sim.enable()


def on_sim(*tensors):
    return [t.to(DEV) for t in tensors]


def bits_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Same dtype, shape and bits (NaNs included)."""
    a, b = a.cpu(), b.cpu()
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.dtype.is_floating_point:
        int_t = {2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
        return torch.equal(a.contiguous().view(int_t), b.contiguous().view(int_t))
    return torch.equal(a, b)


def small_decoders(custom_ops: bool):
    """The shipped decoder, small, on the CPU and on gxsim with the same weights, and a KV cache for each
    (build_decoder loads the example ops' library, which make build builds)."""
    from examples.models.decoder import DecoderConfig, build_decoder

    cfg = DecoderConfig(vocab_size=64, hidden=32, heads=2, layers=2, intermediate=48, max_positions=8,
                        custom_ops=custom_ops)
    cpu_model = build_decoder(cfg)
    sim_model = build_decoder(cfg).to(DEV)
    k, v = cpu_model.new_cache()
    return cpu_model, sim_model, (k, v), (k.to(DEV), v.to(DEV))


# ---- enabling -------------------------------------------------------------------------------------

def test_enable_is_idempotent_and_registers_the_device():
    assert sim.enable() == DEV == "gxsim"
    assert torch._C._get_privateuse1_backend_name() == "gxsim"
    t = torch.randn(3).to(DEV)
    assert t.device == torch.device("gxsim:0") and t.is_gxsim
    assert torch.accelerator.current_accelerator().type == "gxsim"
    assert torch.accelerator.device_count() == 1


# ---- eager is the CPU, bit for bit -----------------------------------------------------------------

EAGER_CASES = {
    "matmul": lambda a, b, m, i: a @ b,
    "addmm": lambda a, b, m, i: torch.addmm(m[:, :3], a, b),
    "softmax": lambda a, b, m, i: torch.softmax(a * 3.7, dim=-1),
    "log_softmax_half": lambda a, b, m, i: torch.log_softmax(a.half(), dim=0).float(),
    "layer_norm": lambda a, b, m, i: torch.nn.functional.layer_norm(a, a.shape[-1:]),
    "inplace_chain": lambda a, b, m, i: a.clone().mul_(1.5).add_(m[:, :5], alpha=0.3).exp_(),
    "views": lambda a, b, m, i: a.t()[1:4, ::2].unsqueeze(0).expand(2, -1, -1).reshape(2, -1) + 1,
    "transpose_contiguous": lambda a, b, m, i: a.transpose(0, 1).contiguous(),
    "index_select_gather": lambda a, b, m, i: a.index_select(1, i[0]) + a.gather(1, i.expand(4, -1)),
    "advanced_indexing": lambda a, b, m, i: a[i[:2], 1:] * a[a > 0].sum(),
    "index_put_": lambda a, b, m, i: a.clone().index_put_((i[:2],), torch.ones(5, device=a.device)),
    "masked_fill_where": lambda a, b, m, i: torch.where(a > 0, a, m[:, :5]).masked_fill(a < -1, 7.0),
    "reductions": lambda a, b, m, i: torch.stack([a.sum(0), a.amax(0), a.mean(0), a.var(0)]),
    "cumsum_sort": lambda a, b, m, i: a.cumsum(1) + a.sort(1).values,
    "cat_split": lambda a, b, m, i: torch.cat(list(a.split(2, dim=1)) + [m], dim=1),
    "arange_outer": lambda a, b, m, i: torch.outer(torch.arange(4, device=a.device).float(), a[0]),
    "dtype_casts": lambda a, b, m, i: (a * 100).to(torch.int32).to(torch.float64) / 3,
    "scalar_promotion": lambda a, b, m, i: (i + 2.5, a + torch.tensor(2, dtype=torch.float64)),
    "topk_argmax": lambda a, b, m, i: (a.topk(2, dim=1).values, a.argmax(-1)),
    "nonzero": lambda a, b, m, i: torch.nonzero(a > 0),
}


@pytest.mark.parametrize("case", sorted(EAGER_CASES))
def test_eager_on_gxsim_is_eager_on_cpu_bit_for_bit(case):
    torch.manual_seed(0)
    a, b, m = torch.randn(4, 5), torch.randn(5, 3), torch.randn(4, 6)
    i = torch.tensor([[2, 0, 3]])
    fn = EAGER_CASES[case]
    expected = fn(a, b, m, i)
    got = fn(*on_sim(a, b, m, i))
    if isinstance(expected, torch.Tensor):
        expected, got = (expected,), (got,)
    for g, e in zip(got, expected):
        assert g.device.type == DEV
        assert bits_equal(g, e), case


def test_inplace_and_views_write_the_same_gxsim_memory():
    x = torch.zeros(4, 4, device=DEV)
    ptr = x.data_ptr()
    row = x[1]
    assert row.data_ptr() == ptr + 4 * 4
    row.add_(3)  # through a view
    y = x.add_(1)
    assert y is x and x.data_ptr() == ptr
    expected = torch.ones(4, 4)
    expected[1] += 3
    assert bits_equal(x, expected)


def test_nn_module_on_gxsim_matches_cpu():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.LayerNorm(32), nn.GELU(), nn.Linear(32, 8)).eval()
    x = torch.randn(3, 16)
    with torch.no_grad():
        expected = model(x)
        model.to(DEV)
        got = model(x.to(DEV))
    assert all(p.device.type == DEV for p in model.parameters())
    assert bits_equal(got, expected)


@pytest.mark.parametrize("custom_ops", [False, True])
def test_shipped_decoder_on_gxsim_matches_cpu(custom_ops):
    cpu_model, sim_model, (k, v), (ks, vs) = small_decoders(custom_ops)
    tokens = torch.tensor([[1]])
    tokens_s = tokens.to(DEV)
    with torch.no_grad():
        for step in range(3):
            pos = torch.tensor([step])
            expected = cpu_model(tokens, pos, k, v)
            got = sim_model(tokens_s, pos.to(DEV), ks, vs)
            assert bits_equal(got, expected), step
            assert bits_equal(ks, k) and bits_equal(vs, v), step
            tokens = expected[:, -1].argmax(-1, keepdim=True)
            tokens_s = got[:, -1].argmax(-1, keepdim=True)


# ---- streams and events ----------------------------------------------------------------------------

def test_streams_and_events():
    default = torch.accelerator.current_stream()
    assert default.device == torch.device(DEV, 0) and default.stream_id == 0
    s1, s2 = torch.Stream(device=DEV), torch.Stream(device=DEV)
    assert len({default.stream_id, s1.stream_id, s2.stream_id}) == 3
    with s1:
        assert torch.accelerator.current_stream() == s1
        x = torch.ones(3, device=DEV) * 2
        start = torch.Event(device=DEV, enable_timing=True)
        start.record()
        y = x + 1
        end = torch.Event(device=DEV, enable_timing=True)
        end.record()
    assert torch.accelerator.current_stream() == default
    s2.wait_event(end)
    assert end.query() and s1.query()
    end.synchronize()
    s1.synchronize()
    torch.accelerator.synchronize()
    assert start.elapsed_time(end) >= 0
    assert bits_equal(y, torch.full((3,), 3.0))


# ---- capture and replay ----------------------------------------------------------------------------

def program(x, w, b, acc):
    h = torch.relu(x @ w + b)
    acc.add_(h.sum(0))           # in place on a static buffer
    return torch.softmax(h, -1) * 2, h[:, :2]


def test_capture_records_without_running_and_replay_reruns_on_the_same_buffers():
    torch.manual_seed(0)
    x, w, b = torch.randn(3, 4), torch.randn(4, 5), torch.randn(5)
    acc = torch.zeros(5)
    sx, sw, sb, sacc = on_sim(x, w, b, acc)
    g = sim.Graph()
    sim.reset_stats()
    with sim.graph(g):
        out, view = program(sx, sw, sb, sacc)
    st = sim.stats()
    assert st["captures"] == 1 and st["kernel_launches"] == 0 and st["captured_launches"] == g.num_launches() > 3
    # Captured work did not run: the in-place update of the static buffer is not applied yet.
    assert bits_equal(sacc, torch.zeros(5))
    out_ptr, view_ptr = out.data_ptr(), view.data_ptr()

    sim.reset_stats()
    g.replay()
    st = sim.stats()
    assert st["graph_replays"] == 1 and st["kernel_launches"] == 0
    assert st["replayed_launches"] == g.num_launches()
    exp_out, exp_view = program(x, w, b, acc)
    assert bits_equal(out, exp_out) and bits_equal(view, exp_view) and bits_equal(sacc, acc)
    assert out.data_ptr() == out_ptr and view.data_ptr() == view_ptr

    # Replay reads the inputs' current contents: new values in the static input, same output buffers.
    x2 = torch.randn(3, 4)
    sx.copy_(x2.to(DEV))
    g.replay()
    exp_out, exp_view = program(x2, w, b, acc)
    assert bits_equal(out, exp_out) and bits_equal(view, exp_view) and bits_equal(sacc, acc)
    assert out.data_ptr() == out_ptr


def test_gxsim_to_gxsim_copy_is_captured():
    src, dst = torch.arange(4.0, device=DEV), torch.zeros(4, device=DEV)
    g = sim.Graph()
    with sim.graph(g):
        dst.copy_(src)
    assert bits_equal(dst, torch.zeros(4))
    g.replay()
    assert bits_equal(dst, torch.arange(4.0))
    src.fill_(7)
    g.replay()
    assert bits_equal(dst, torch.full((4,), 7.0))


def test_capture_on_the_default_stream_is_refused():
    g = sim.Graph()
    with pytest.raises(RuntimeError, match="non-default stream"):
        g.capture_begin()


# ---- memory pools ----------------------------------------------------------------------------------

def test_general_pool_caches_freed_blocks():
    # larger than any block another test frees (tests of device graphs may run first in this process and leave
    # smaller blocks cached): the block freed here is the only one that fits
    n = 3_000_017
    a = torch.empty(n, device=DEV)
    ptr = a.data_ptr()
    assert sim.pool_of(a) == (0, 0)
    reserved = sim.stats()["reserved_bytes"]
    del a
    b = torch.empty(n, device=DEV)
    assert b.data_ptr() == ptr and sim.stats()["reserved_bytes"] == reserved


def test_memory_allocated_during_capture_belongs_to_the_graph_pool():
    n = 4_000_037  # larger than any other test's blocks (the one above included): only the pool's blocks fit
    x = torch.randn(n, device=DEV)
    g = sim.Graph()
    with sim.graph(g):
        tmp = x * 2
        out = tmp + 1
    pool = g.pool()
    assert pool != (0, 0) and sim.pool_of(out) == pool and sim.pool_of(tmp) == pool
    graph_ptrs = {tmp.data_ptr(), out.data_ptr()}
    del tmp  # freed into the graph's pool: eager work must not get it while the graph lives
    eager = [torch.empty(n, device=DEV) for _ in range(8)]
    assert not graph_ptrs & {e.data_ptr() for e in eager}
    assert all(sim.pool_of(e) == (0, 0) for e in eager)
    g.replay()
    assert bits_equal(out, x.cpu() * 2 + 1)
    freed = out.data_ptr()
    del out
    g.reset()  # the pool is released: its blocks go to the general pool
    again = [torch.empty(n, device=DEV) for _ in range(8)]
    assert freed in {e.data_ptr() for e in again}


def test_two_graphs_share_a_pool():
    x = torch.randn(128, device=DEV)
    g1, g2 = sim.Graph(), sim.Graph()
    with sim.graph(g1):
        y1 = x + 1
    ptr1 = y1.data_ptr()
    del y1  # dead output of g1: a graph sharing g1's pool may reuse its memory (as on CUDA)
    with sim.graph(g2, pool=g1.pool()):
        y2 = x * 3
    assert g2.pool() == g1.pool() and sim.pool_of(y2) == g1.pool()
    assert y2.data_ptr() == ptr1
    g2.replay()
    assert bits_equal(y2, x.cpu() * 3)
    g1.reset()  # g2 still holds the pool: its memory stays out of the general pool
    eager = [torch.empty(128, device=DEV) for _ in range(4)]
    assert all(sim.pool_of(e) == (0, 0) for e in eager)
    assert sim.pool_of(y2) == g2.pool()
    g2.replay()
    assert bits_equal(y2, x.cpu() * 3)
    g2.reset()


def test_graph_pool_handle_is_shared_by_graphs():
    handle = sim.graph_pool_handle()
    x = torch.randn(8, device=DEV)
    g1, g2 = sim.Graph(), sim.Graph()
    with sim.graph(g1, pool=handle):
        a = x + 1
    with sim.graph(g2, pool=handle):
        b = a * 2   # g2 reads g1's output buffer
    assert sim.pool_of(a) == sim.pool_of(b) == handle
    g1.replay()
    g2.replay()
    assert bits_equal(b, (x.cpu() + 1) * 2)


# ---- what breaks a capture -------------------------------------------------------------------------

@pytest.mark.parametrize("sync", ["item", "to_cpu", "from_cpu", "synchronize", "stream_sync", "nonzero"])
def test_host_sync_during_capture_raises_and_the_device_stays_usable(sync):
    x = torch.randn(4, device=DEV)
    stream = torch.Stream(device=DEV)
    actions = {
        "item": (lambda: x.sum().item(), "_local_scalar_dense"),
        "to_cpu": (lambda: x.cpu(), "gxsim tensor to the CPU"),
        "from_cpu": (lambda: x.copy_(torch.ones(4)), "CPU tensor to gxsim"),
        "synchronize": (lambda: torch.accelerator.synchronize(), "synchroniz"),
        "stream_sync": (lambda: stream.synchronize(), "synchroniz"),
        "nonzero": (lambda: torch.nonzero(x), "aten::nonzero"),
    }
    action, what = actions[sync]
    g = sim.Graph()
    with stream:
        g.capture_begin()
        y = x * 2
        with pytest.raises(RuntimeError, match="operation not permitted when stream is capturing") as info:
            action()
        assert what in str(info.value)
        with pytest.raises(RuntimeError, match="previous error during capture"):
            _ = y + 1  # the capture is invalidated, as on CUDA
        with pytest.raises(RuntimeError, match="previous error during capture"):
            g.capture_end()
    assert not sim.is_current_stream_capturing()
    with pytest.raises(RuntimeError, match="without a preceding successful capture"):
        g.replay()
    # Usable afterwards: eager work, a host read, and a new capture on the same stream.
    assert (x * 2).sum().item() == pytest.approx(x.cpu().mul(2).sum().item())
    g2 = sim.Graph()
    with sim.graph(g2, stream=stream):
        z = x + 5
    g2.replay()
    assert bits_equal(z, x.cpu() + 5)


def test_error_inside_sim_graph_context_propagates_and_ends_the_capture():
    x = torch.randn(3, device=DEV)
    with pytest.raises(RuntimeError, match="operation not permitted when stream is capturing"):
        with sim.graph(sim.Graph()):
            x.max().item()
    assert not sim.is_current_stream_capturing()
    assert x.max().item() == x.cpu().max().item()


def test_forked_stream_joins_the_capture_and_must_rejoin():
    x = torch.randn(4, device=DEV)
    side = torch.Stream(device=DEV)
    g = sim.Graph()
    main = torch.Stream(device=DEV)
    with sim.graph(g, stream=main):
        y = x + 1
        fork = torch.Event(device=DEV)
        fork.record(main)
        side.wait_event(fork)
        with side:
            z = y * 3            # recorded: the side stream is part of the capture
        join = torch.Event(device=DEV)
        join.record(side)
        main.wait_event(join)
        out = z - 1
    assert sim.stats()["kernel_launches"] >= 0 and g.num_launches() == 3
    g.replay()
    assert bits_equal(out, (x.cpu() + 1) * 3 - 1)

    g2 = sim.Graph()
    with pytest.raises(RuntimeError, match="unjoined"):
        with sim.graph(g2, stream=main):
            fork = torch.Event(device=DEV)
            fork.record(main)
            side.wait_event(fork)
            with side:
                _ = x * 2        # never joined back
    assert not sim.is_current_stream_capturing()


def test_other_streams_run_eagerly_during_a_capture():
    x = torch.randn(4, device=DEV)
    g = sim.Graph()
    other = torch.Stream(device=DEV)
    with sim.graph(g):
        y = x + 1
        with other:
            before = sim.stats()["kernel_launches"]
            eager = x * 10  # not part of the capture: runs now
            assert sim.stats()["kernel_launches"] == before + 1
    assert bits_equal(eager, x.cpu() * 10)
    g.replay()
    assert bits_equal(y, x.cpu() + 1)


# ---- torch.accelerator.Graph -----------------------------------------------------------------------

@pytest.mark.skipif(not hasattr(torch.accelerator, "Graph"), reason="torch.accelerator.Graph is torch >= 2.12")
def test_torch_accelerator_graph_on_gxsim():
    x = torch.zeros(5, device=DEV)
    stream = torch.Stream(device=DEV)
    graph = torch.accelerator.Graph()
    with stream, graph:
        x += 1
        y = x * 2
    assert bits_equal(x, torch.zeros(5))  # captured, not run
    sim.reset_stats()
    graph.replay()
    graph.replay()
    assert sim.stats()["graph_replays"] == 2 and sim.stats()["kernel_launches"] == 0
    assert bits_equal(x, torch.full((5,), 2.0)) and bits_equal(y, torch.full((5,), 4.0))
    assert graph.pool() != (0, 0) and sim.pool_of(y) == tuple(graph.pool())
    shared = torch.accelerator.Graph(pool=graph.pool())
    with stream, shared:
        z = x + 1
    assert sim.pool_of(z) == tuple(graph.pool())


@pytest.mark.parametrize("custom_ops", [False, True])
def test_decoder_step_captured_once_replays_every_step(custom_ops):
    """One decode step of the shipped decoder (its custom ops included) captured once; each step
    writes the static inputs and replays, bit for bit the CPU's eager loop, with no launch outside
    the replay."""
    cpu_model, sim_model, (k, v), (ks, vs) = small_decoders(custom_ops)
    tokens_s = torch.zeros(1, 1, dtype=torch.long, device=DEV)
    pos_s = torch.zeros(1, dtype=torch.long, device=DEV)
    g = sim.Graph()
    with torch.no_grad(), sim.graph(g):
        logits_s = sim_model(tokens_s, pos_s, ks, vs)
    assert bits_equal(ks, k)  # the cache update was captured, not run
    tokens = torch.tensor([[1]])
    with torch.no_grad():
        for step in range(4):
            pos = torch.tensor([step])
            expected = cpu_model(tokens, pos, k, v)
            tokens_s.copy_(tokens.to(DEV))
            pos_s.copy_(pos.to(DEV))
            sim.reset_stats()
            g.replay()
            assert sim.stats()["kernel_launches"] == 0 and sim.stats()["graph_replays"] == 1
            assert bits_equal(logits_s, expected), step
            assert bits_equal(ks, k) and bits_equal(vs, v), step
            tokens = expected[:, -1].argmax(-1, keepdim=True)


def test_pinned_memory_and_accelerator_memory_api():
    pinned = torch.randn(16).pin_memory()
    assert pinned.is_pinned()
    assert bits_equal(pinned.to(DEV, non_blocking=True), pinned)
    torch.accelerator.empty_cache()
    if hasattr(torch.accelerator, "empty_host_cache"):  # torch >= 2.12
        torch.accelerator.empty_host_cache()
    x = torch.empty(1024, device=DEV)  # noqa: F841
    assert torch.accelerator.memory_stats()["allocated_bytes.all.current"] >= 4096
