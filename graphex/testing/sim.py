"""gxsim: a simulated accelerator with CUDA graphs' semantics, for testing device graphs without a GPU.

    from graphex.testing import sim
    dev = sim.enable()                       # "gxsim": loads libgraphex_sim.so once
    x = torch.randn(3).to(dev)               # host memory; kernels are the CPU kernels

    g = sim.Graph()
    with sim.graph(g):                       # capture on a side stream: recorded, not run
        y = x * 2
    g.replay()                               # runs the recorded launches on the same buffers

The C++ is in csrc/testing/sim (its README says what each file provides). The library registers
the PrivateUse1 backend (device guard and streams, caching allocator with graph pools, hooks, a
boxed fallback that runs the CPU kernels on gxsim memory or records them during capture) and, on
torch >= 2.12, the implementation of torch.accelerator.Graph for it. Nothing is loaded until
enable() is called.
"""

from __future__ import annotations

import contextlib
import os
import types
from pathlib import Path

import torch

NAME = "gxsim"
LIBRARY = "libgraphex_sim.so"
ENV_LIBRARY = "GRAPHEX_SIM_LIB"

_enabled = False
_STATS = ("graph_replays", "captures", "kernel_launches", "captured_launches", "replayed_launches",
          "allocated_bytes", "reserved_bytes")


def library_path() -> Path:
    """$GRAPHEX_SIM_LIB, else installed next to graphex._C (graphex/_sim/), else the build tree."""
    if os.environ.get(ENV_LIBRARY):
        return Path(os.environ[ENV_LIBRARY])
    from ..base.libraries import built_library

    return built_library("_sim", LIBRARY, f"build the graphex_sim target (make build) or set {ENV_LIBRARY}")


def _device_module() -> types.ModuleType:
    """torch.gxsim: what torch looks up on a custom device's module."""
    mod = types.ModuleType(f"torch.{NAME}")
    mod.is_available = lambda: True
    mod.is_initialized = lambda: True
    mod._is_in_bad_fork = lambda: False
    mod._lazy_init = lambda: None
    mod.device_count = lambda: 1
    mod.current_device = lambda: 0
    mod.set_device = lambda device: None
    mod.synchronize = lambda device=None: torch.accelerator.synchronize()
    # gxsim kernels draw from the CPU generator (seeded by torch.manual_seed already), so its RNG state is the
    # CPU's: torch.random.fork_rng (which opcheck and AOTAutograd run over every registered device) saves and
    # restores it through these.
    mod.manual_seed_all = lambda seed: None
    mod.manual_seed = lambda seed: None
    mod.get_rng_state = lambda device=None: torch.get_rng_state()
    mod.set_rng_state = lambda state, device=None: torch.set_rng_state(state)
    mod.get_rng_state_all = lambda: [torch.get_rng_state()]
    mod.set_rng_state_all = lambda states: torch.set_rng_state(states[0])
    mod.initial_seed = torch.initial_seed
    mod.seed = lambda: None
    mod.seed_all = lambda: None
    mod.get_amp_supported_dtype = lambda: []
    mod.GXSIMGraph = Graph  # a backend's own graph class, as torch.cuda.CUDAGraph (Note [Which graph class a device uses])
    return mod


def enable() -> str:
    """Load the gxsim library (once), register PrivateUse1 as "gxsim", return the device name."""
    global _enabled
    if _enabled:
        return NAME
    current = torch._C._get_privateuse1_backend_name()
    if current not in ("privateuseone", NAME):
        raise RuntimeError(f"PrivateUse1 is already registered as {current!r}; gxsim cannot be enabled")
    torch.ops.load_library(os.fspath(library_path()))
    if current != NAME:
        torch.utils.rename_privateuse1_backend(NAME)
    if not hasattr(torch, NAME):
        torch._register_device_module(NAME, _device_module())
    if not hasattr(torch.Tensor, f"is_{NAME}"):
        torch.utils.generate_methods_for_privateuse1_backend()
    _enabled = True
    return NAME


def _ops():
    enable()
    return torch.ops.graphex_sim


def stats() -> dict[str, int]:
    """Counters since reset_stats(): graph_replays, captures (that ended with a graph),
    kernel_launches (device work run outside any replay: kernels and copies), captured_launches,
    replayed_launches; and the allocator's allocated_bytes / reserved_bytes (not reset)."""
    return dict(zip(_STATS, _ops().stats()))


def reset_stats() -> None:
    _ops().reset_stats()


def graph_pool_handle() -> tuple[int, int]:
    """A new pool id to share between graphs (like torch.cuda.graph_pool_handle())."""
    return tuple(_ops().graph_pool_handle())


def pool_of(tensor: torch.Tensor) -> tuple[int, int]:
    """The memory pool of a gxsim tensor's block: (0, 0) general, else a graph pool id."""
    return tuple(_ops().pool_of(tensor))


def empty_cache() -> None:
    """Free the general pool's cached blocks (does nothing while any graph pool exists)."""
    _ops().empty_cache()


def is_current_stream_capturing() -> bool:
    return bool(_ops().is_current_stream_capturing())


class Graph:
    """A gxsim graph with at::cuda::CUDAGraph's API (works on every torch graphex supports)."""

    def __init__(self, keep_graph: bool = False):
        enable()
        self._graph = torch.classes.graphex_sim.Graph(keep_graph)

    def capture_begin(self, pool: tuple[int, int] | None = None, capture_error_mode: str = "default") -> None:
        """Begin capturing the current stream (not the default stream)."""
        a, b = pool if pool is not None else (0, 0)
        self._graph.capture_begin(int(a), int(b))

    def capture_end(self) -> None:
        self._graph.capture_end()

    def instantiate(self) -> None:
        self._graph.instantiate()

    def replay(self) -> None:
        self._graph.replay()

    def reset(self) -> None:
        self._graph.reset()

    def pool(self) -> tuple[int, int]:
        return tuple(self._graph.pool())

    def num_launches(self) -> int:
        return int(self._graph.num_launches())

    def debug_dump(self, path: str | None = None) -> str:
        text = self._graph.dump()
        if path is not None:
            Path(path).write_text(text)
        return text


@contextlib.contextmanager
def graph(g: Graph, pool: tuple[int, int] | None = None, stream: torch.Stream | None = None):
    """Capture into `g` on `stream` (default: a new side stream), like torch.cuda.graph. If the body
    raises, the capture is ended (its own error dropped) and the body's exception propagates."""
    enable()
    stream = stream if stream is not None else torch.Stream(device=NAME)
    previous = torch.accelerator.current_stream(torch.device(NAME))
    torch.accelerator.set_stream(stream)
    try:
        g.capture_begin(pool=pool)
        try:
            yield g
        except BaseException:
            with contextlib.suppress(RuntimeError):
                g.capture_end()
            raise
        g.capture_end()
    finally:
        torch.accelerator.set_stream(previous)
