"""One rank of the small distributed checks (tests/python/test_distributed_decode.py), started by launch.py.

    small_worker.py cache DIR      a cache_compile'd step with an all_reduce, 3 calls; prints STATS {...}
    small_worker.py exit           rank 1 exits (os._exit(3)) before its 3rd step; the others must fail fast
    small_worker.py hang SECONDS   rank 1 sleeps SECONDS before its 3rd step (never arrives within the timeout)

The process group's timeout is $TIMEOUT seconds (default 60). Rank 0 prints FAILED {...} with the error's
class, message and finding fields, and how long after the last good step it came.
"""

from __future__ import annotations

import datetime
import json
import os
import sys
import time

import torch
import torch.distributed as dist

import graphex

RANK = int(os.environ["RANK"])


def step(x: torch.Tensor) -> torch.Tensor:
    y = x * 2
    dist.all_reduce(y)
    return y + 1


def main() -> int:
    mode = sys.argv[1]
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=float(os.environ.get("TIMEOUT", 60))))
    x = torch.arange(6.0).reshape(2, 3) + RANK
    if mode == "cache":
        fn = graphex.inference.cache_compile(step, cache_dir=sys.argv[2])
    else:
        fn = torch.compile(step, backend="graphex", fullgraph=True, dynamic=False)
    last_ok = time.monotonic()
    with torch.no_grad():
        for i in range(5 if mode != "cache" else 3):
            if RANK == 1 and i == 2 and mode == "exit":
                os._exit(3)
            if RANK == 1 and i == 2 and mode == "hang":
                time.sleep(float(sys.argv[2]))
                return 4
            try:
                out = fn(x)
            except Exception as e:  # what the user would see
                f = getattr(e, "finding", None)
                print("FAILED " + json.dumps({
                    "rank": RANK, "step": i, "seconds": time.monotonic() - last_ok, "type": type(e).__name__,
                    "is_replay_error": isinstance(e, graphex.ReplayError), "message": str(e),
                    "why": getattr(f, "why", ""), "fix": getattr(f, "fix", ""), "where": getattr(f, "where", "")}),
                    flush=True)
                return 1
            last_ok = time.monotonic()
            expected = step(x.clone())
            if not torch.equal(out, expected):
                print(f"MISMATCH at step {i}", flush=True)
                return 2
    if mode == "cache":
        print("STATS " + json.dumps({"rank": RANK, "world": dist.get_world_size(), **fn.stats}), flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
