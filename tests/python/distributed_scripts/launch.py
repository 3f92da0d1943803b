"""Start N ranks of a script on this machine (gloo over 127.0.0.1), bounded in time.

`launch(script, world=2, timeout=...)` runs `python script ARGS` once per rank with RANK,
WORLD_SIZE, LOCAL_RANK, MASTER_ADDR=127.0.0.1 and a free MASTER_PORT set, as torchrun does,
waits for all of them and returns one RankResult per rank. Past `timeout` seconds every rank
still running is killed (its whole process group) and reported with timed_out=True: a test
that uses this never hangs, whatever the ranks do.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import socket
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


@dataclasses.dataclass
class RankResult:
    rank: int
    returncode: int | None
    stdout: str
    stderr: str
    timed_out: bool
    seconds: float


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(script: str, *args: str, world: int = 2, timeout: float = 240.0,
           env: dict[str, str] | None = None) -> list[RankResult]:
    base = dict(os.environ)
    base.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "WORLD_SIZE": str(world),
                 "LOCAL_WORLD_SIZE": str(world), "OMP_NUM_THREADS": "1",
                 "PYTHONPATH": os.pathsep.join(p for p in (ROOT, base.get("PYTHONPATH", "")) if p)})
    base.update(env or {})
    start = time.monotonic()
    procs = []
    for rank in range(world):
        rank_env = dict(base, RANK=str(rank), LOCAL_RANK=str(rank))
        procs.append(subprocess.Popen([sys.executable, script, *args], cwd=ROOT, env=rank_env, text=True,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True))
    results: list[RankResult | None] = [None] * world
    try:
        for rank, proc in enumerate(procs):
            left = max(1.0, timeout - (time.monotonic() - start))
            try:
                out, err = proc.communicate(timeout=left)
                results[rank] = RankResult(rank, proc.returncode, out, err, False, time.monotonic() - start)
            except subprocess.TimeoutExpired:
                _kill(proc)
                out, err = proc.communicate()
                results[rank] = RankResult(rank, None, out, err, True, time.monotonic() - start)
    finally:
        for proc in procs:  # whatever happened above, no rank outlives the launch
            if proc.poll() is None:
                _kill(proc)
                proc.communicate()
    return [r for r in results if r is not None]


def _kill(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        proc.kill()
