"""Runs the cache project once in a fresh process and reports what happened, as JSON (for test_cache.py).

    python cache_driver.py PROJECT_DIR CACHE_DIR [--dim N] [--blocks N] [--eps X] [--batch N]
                           [--options JSON] [--version graphex=V|torch=V]
"""

import argparse
import json
import sys
import time


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("project")
    p.add_argument("cache_dir")
    p.add_argument("--dim", type=int, default=8)
    p.add_argument("--blocks", type=int, default=2)
    p.add_argument("--eps", type=float, default=1e-5)
    p.add_argument("--batch", type=int, default=3)
    p.add_argument("--options", default="null")
    p.add_argument("--version", default="")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    sys.path.insert(0, args.project)

    import torch

    import graphex

    if args.version:
        which, value = args.version.split("=")
        if which == "graphex":
            graphex.__version__ = value
        else:
            torch.__version__ = value
    import model

    torch.manual_seed(args.seed)
    m = model.Model(args.dim, args.blocks, args.eps, cache_dir=args.cache_dir, options=json.loads(args.options))
    x = torch.randn(args.batch, args.dim)
    with torch.no_grad():
        # torch imports Dynamo at the first call of any torch.library.custom_op, in eager too: paid here, so that
        # first_call_s is what the cache costs
        torch.ops.cachetest.shift(x, 0.0)
        start = time.perf_counter()
        first = m(x)
        first_s = time.perf_counter() - start
        second = m(x)
        expected = m._forward(x)
    # Note [A cache hit imports no compiler]: graphex imports Dynamo only on a miss, so its compile counter is read
    # only where Dynamo was loaded.
    dynamo = sys.modules.get("torch._dynamo")
    print(json.dumps({
        "stats": m.cached_forward.stats,
        "dynamo_imported": dynamo is not None,
        "dynamo_compiles": dynamo.utils.counters["stats"]["unique_graphs"] if dynamo is not None else 0,
        "equal": bool(torch.equal(first, expected) and torch.equal(second, expected)),
        "first_call_s": first_s,
    }))


if __name__ == "__main__":
    main()
