"""The device-graph check on a real accelerator (issue 20 point 7), in one run of at most ~8 minutes.

    make gpu-check                          # on a GPU machine: build graphex, then this script on cuda
    python scripts/gpu_check.py --device gxsim --quick   # the same checks on the simulated device (no GPU)

1. Checks (the device tests' claims, on the real device): the shipped decoder through torch.compile is one
   replay per step after the first, its logits and KV caches bit for bit eager's on the same device; outputs
   held across calls are not overwritten; a KV cache at a new address recaptures; work on a side stream is
   captured as fork/join; a 1-GPU NCCL group's collectives (all_reduce, all_gather) run inside the graph; and
   tests/python/test_device_graphs.py, the simulated device's tests, on this device (GRAPHEX_TEST_DEVICE).
2. Benchmark of a one-token decode step (the shipped decoder; a transformers Llama-style decoder from a config at
   batch 1 and 8 when transformers is installed): eager, torch.compile(mode="reduce-overhead"), inductor and
   graphex: median step time, first-call time. Inductor's are CUDA-only (skipped on other devices).

Writes OUT.json and prints a table (default out: gpu_check.json). Exit status 1 if a check fails.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import traceback
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _sync(device: torch.device) -> None:
    torch.accelerator.synchronize(device) if device.type != "cpu" else None


def _compile(model, backend: str, **kw):
    torch._dynamo.reset()
    return torch.compile(model, backend=backend, fullgraph=True, dynamic=False, **kw)


def _runners():
    from graphex.runtime import live_graphs

    return [g.device_graphs for g in live_graphs() if g.device_graphs is not None]


# ---- 1. checks -------------------------------------------------------------------------------------------------

def check_decoder(device: torch.device, steps: int) -> dict:
    from examples.models.decoder import DecoderConfig, build_decoder

    cfg = DecoderConfig(layers=2)
    eager = build_decoder(cfg).to(device)
    model = build_decoder(cfg).to(device)
    k_e, v_e = (t.to(device) for t in eager.new_cache())
    k_g, v_g = k_e.clone(), v_e.clone()
    step = _compile(model, "graphex")
    token = torch.tensor([[1]], device=device)
    with torch.no_grad():
        for i in range(steps):
            pos = torch.tensor([i], device=device)
            got = step(token, pos, k_g, v_g)
            want = eager(token, pos, k_e, v_e)
            assert torch.equal(got, want), f"step {i}: logits differ from eager on {device}"
            assert torch.equal(k_g, k_e) and torch.equal(v_g, v_e), f"step {i}: KV cache differs"
            token = want.argmax(-1)
    (runner,) = _runners()
    assert runner.captures == 1 and runner.replays == steps - 1, (runner.captures, runner.replays)
    return {"steps": steps, "captures": runner.captures, "replays": runner.replays, "bitwise": True}


def check_held_outputs(device: torch.device) -> dict:
    f = _compile(lambda x, y: (x @ y).tanh() + x.sum(), "graphex")
    torch.manual_seed(1)
    calls = [(torch.randn(6, 5, device=device), torch.randn(5, 4, device=device)) for _ in range(8)]
    held = [f(x, y) for x, y in calls]
    ref = [(x @ y).tanh() + x.sum() for x, y in calls]
    assert all(torch.equal(h, r) for h, r in zip(held, ref)), "a held output was overwritten by a later replay"
    return {"calls": len(calls)}


def check_recapture(device: torch.device) -> dict:
    def step(x, cache):
        cache.add_(x)
        return cache * 1

    f = _compile(step, "graphex")
    a, b = torch.zeros(4, device=device), torch.zeros(4, device=device)
    for _ in range(3):
        f(torch.ones(4, device=device), a)
    f(torch.ones(4, device=device), b)
    assert torch.equal(b.cpu(), torch.ones(4)) and torch.equal(a.cpu(), torch.full((4,), 3.0)), "wrote the old cache"
    return {"recaptured": True}


def check_side_streams(device: torch.device) -> dict:
    """Note [Side streams in a program]: work forked to a side stream is recorded into the same device graph and
    joined back (torch >= 2.13; before, it runs in order on the calling stream); each later call is one replay,
    bit for bit eager on the same device."""
    side = torch.Stream(device=device)

    def step(x, w):
        y = x @ w
        side.wait_stream(torch.accelerator.current_stream(device))
        with side:
            z = (y * 2).sin()
        u = y.cos()
        torch.accelerator.current_stream(device).wait_stream(side)
        return z + u

    return _one_capture_then_replays(step, device, rows=16, width=64, seed=2)


def _one_capture_then_replays(step, device: torch.device, rows: int, width: int, seed: int, calls: int = 5) -> dict:
    """`step(x, w)` compiled by graphex, called with a new x each time: each result bit for bit eager's on `device`;
    the first call runs on the engine, the second captures, and every call after it is a replay."""
    f = _compile(step, "graphex")
    torch.manual_seed(seed)
    w = torch.randn(width, width, device=device)
    before = {id(r) for r in _runners()}
    for i in range(calls):
        x = torch.randn(rows, width, device=device)
        assert torch.equal(f(x, w), step(x, w)), f"call {i}: differs from eager on {device}"
    (runner,) = [r for r in _runners() if id(r) not in before]
    assert runner.captures == 1 and runner.replays == calls - 1, (runner.captures, runner.replays)
    return {"calls": calls, "captures": runner.captures, "replays": runner.replays, "bitwise": True}


def check_nccl_one_gpu(device: torch.device) -> dict:
    """A 1-GPU NCCL group: functional all_reduce and all_gather inside the compiled step, captured into the device
    graph (NCCL supports capture), each call bit for bit eager's on the same device."""
    import torch.distributed as dist

    if device.type != "cuda" or not dist.is_available() or not dist.is_nccl_available():
        return {"skipped": f"needs NCCL on cuda (this run: {device})"}
    import torch.distributed._functional_collectives as funcol

    dist.init_process_group("nccl", store=dist.HashStore(), rank=0, world_size=1, device_id=device)
    try:
        group = dist.group.WORLD

        def step(x, w):
            y = funcol.all_reduce(x @ w, "sum", group)
            return funcol.all_gather_tensor(y.relu(), 0, group) * 2

        return _one_capture_then_replays(step, device, rows=8, width=32, seed=3)
    finally:
        dist.destroy_process_group()


def check_device_tests(device: torch.device) -> dict:
    """tests/python/test_device_graphs.py, the simulated device's tests, run on this device (GRAPHEX_TEST_DEVICE)."""
    import importlib.util
    import os
    import subprocess

    if device.type != "cuda":
        return {"skipped": "on gxsim these tests run in make test"}
    if importlib.util.find_spec("pytest") is None:
        return {"skipped": "pytest is not installed on this machine"}
    env = {**os.environ, "GRAPHEX_TEST_DEVICE": str(device.type)}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           str(ROOT / "tests" / "python" / "test_device_graphs.py")],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    summary = (proc.stdout.strip().splitlines() or [""])[-1]
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    return {"summary": summary}


# ---- 2. benchmark ----------------------------------------------------------------------------------------------

def _median_ms(fn, device: torch.device, calls: int, rounds: int = 5) -> float:
    times = []
    for _ in range(rounds):
        _sync(device)
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        _sync(device)
        times.append((time.perf_counter() - start) / calls * 1e3)
    return statistics.median(times)


def _workloads(device: torch.device, quick: bool):
    from examples.models.decoder import DecoderConfig, build_decoder

    cfg = DecoderConfig(layers=2) if quick else DecoderConfig()
    model = build_decoder(cfg).to(device)
    k, v = (t.to(device) for t in model.new_cache())
    yield "shipped decoder", model, (torch.tensor([[1]], device=device), torch.tensor([3], device=device), k, v)
    try:
        import transformers
    except ImportError:
        return
    from transformers import LlamaConfig, LlamaForCausalLM, StaticCache

    transformers.logging.set_verbosity_error()
    for batch in (1, 8):
        cfg = LlamaConfig(vocab_size=1024, hidden_size=256 if quick else 1024, intermediate_size=512 if quick else 2816,
                          num_hidden_layers=2 if quick else 8, num_attention_heads=8, num_key_value_heads=4,
                          max_position_embeddings=256)
        torch.manual_seed(0)
        llama = LlamaForCausalLM(cfg).eval().to(device)
        ids = torch.ones(batch, 1, dtype=torch.long, device=device)
        pos = torch.tensor([5], device=device)

        class Step(torch.nn.Module):
            """One decode step over a StaticCache; `fresh()` gives each backend its own cache (the cache counts the
            tokens written: a few hundred calls per backend stay inside max_cache_len)."""

            def __init__(self, m):
                super().__init__()
                self.m = m
                self.fresh()

            def fresh(self):
                self.cache = StaticCache(config=cfg, max_cache_len=1024)

            def forward(self, ids, pos):
                return self.m(input_ids=ids, past_key_values=self.cache, cache_position=pos, use_cache=True).logits

        yield f"transformers Llama, batch {batch}", Step(llama), (ids, pos)


def benchmark(device: torch.device, quick: bool, log) -> list[dict]:
    rows = []
    backends = [("eager", None), ("graphex", "graphex")]
    if device.type == "cuda":
        backends[1:1] = [("reduce-overhead", "inductor-ro"), ("inductor", "inductor")]
    calls = 20 if quick else 100
    for name, model, args in _workloads(device, quick):
        row = {"workload": name}
        with torch.no_grad():
            for label, backend in backends:
                if hasattr(model, "fresh"):
                    model.fresh()
                try:
                    if backend is None:
                        fn = model
                    elif backend == "inductor-ro":
                        fn = _compile(model, "inductor", mode="reduce-overhead")
                    else:
                        fn = _compile(model, backend)
                    _sync(device)
                    start = time.perf_counter()
                    fn(*args)
                    _sync(device)
                    row[f"{label} first call s"] = round(time.perf_counter() - start, 3)
                    for _ in range(3):
                        fn(*args)
                    row[f"{label} ms"] = round(_median_ms(lambda: fn(*args), device, calls), 4)
                except Exception as e:  # noqa: BLE001  one backend failing is a row entry, not the end of the run
                    row[f"{label} ms"] = f"failed: {type(e).__name__}: {str(e).splitlines()[0][:120]}"
        log(json.dumps(row))
        rows.append(row)
    return rows


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda", help="cuda (default), or gxsim for the simulated device")
    p.add_argument("--quick", action="store_true", help="small models and few calls (a dry run)")
    p.add_argument("--out", default="gpu_check.json")
    p.add_argument("--checks-only", action="store_true", help="the checks, not the benchmark")
    args = p.parse_args()
    import graphex  # noqa: F401

    if args.device == "gxsim":
        from graphex.testing import sim

        sim.enable()
    device = torch.device(args.device)
    report = {"torch": torch.__version__, "device": str(device), "checks": {}, "failed": []}
    if device.type == "cuda":
        report["gpu"] = torch.cuda.get_device_name(device)
    print(f"graphex gpu-check: torch {torch.__version__} on {report.get('gpu', device)}", flush=True)
    for name, fn in (("decoder one replay per step, bitwise", lambda: check_decoder(device, 6)),
                     ("held outputs not overwritten", lambda: check_held_outputs(device)),
                     ("a moved KV cache recaptures", lambda: check_recapture(device)),
                     ("side streams captured as fork/join", lambda: check_side_streams(device)),
                     ("1-GPU NCCL group: collectives in the graph", lambda: check_nccl_one_gpu(device)),
                     ("the device tests (test_device_graphs.py) on this device", lambda: check_device_tests(device))):
        try:
            report["checks"][name] = result = fn()
            print(f"  {'skip' if 'skipped' in result else 'ok  '}  {name}"
                  + (f" ({result['skipped']})" if "skipped" in result else ""), flush=True)
        except Exception:  # noqa: BLE001
            report["failed"].append(name)
            report["checks"][name] = traceback.format_exc(limit=3)
            print(f"  FAIL  {name}\n{traceback.format_exc(limit=3)}", flush=True)
    if not args.checks_only:
        report["benchmark"] = benchmark(device, args.quick, lambda line: print("  " + line, flush=True))
    Path(args.out).write_text(json.dumps(report, indent=1))
    print(f"wrote {args.out}")
    return 1 if report["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
