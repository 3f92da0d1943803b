"""One rank of the collectives test (tests/python/test_distributed.py), started by launch.py.

Every case runs in eager, then compiled with graphex (fullgraph, so a collective that broke the
graph would fail the case), twice, on the same inputs. Each rank prints one line per case:
CASE {"name", "equal", "inputs_equal", "engine_runs", "error"} as JSON. Both ranks run the cases
in the same order, so every collective meets its peer.
"""

from __future__ import annotations

import datetime
import json
import os
import traceback
import warnings

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol

import graphex

warnings.filterwarnings("ignore", category=FutureWarning)  # funcol's *_tensor names are deprecated aliases
RANK, WORLD = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
CALLS = 2  # compiled calls per case: the capture's first run and one replay


def cases(group: dist.ProcessGroup) -> dict:
    """name -> (fn, inputs[, graphs]): fn runs in eager and compiled; inputs are cloned per run. Cases with
    `graphs` > 1 are compiled without fullgraph and must run that many graphs on the engine per call."""
    x = torch.randn(4, 6, generator=torch.Generator().manual_seed(10 + RANK))
    agather = getattr(funcol, "all_gather_single", funcol.all_gather_tensor)
    rscatter = getattr(funcol, "reduce_scatter_single", funcol.reduce_scatter_tensor)
    ops = torch.ops._c10d_functional
    name = dist.distributed_c10d._get_process_group_name(group)
    size = dist.get_world_size(group)
    splits = [1, 3] if RANK == 0 else [2, 2]  # rank r sends splits[j] rows to rank j
    recv = [[1, 3], [2, 2]]  # rows rank r receives from rank j: column r of the send table
    recv_splits = [recv[j][RANK] for j in range(2)] if size == 2 else [4]
    send_splits = splits if size == 2 else [4]

    def c10d_all_reduce(t):
        t = t * 3
        dist.all_reduce(t, group=group)
        return t + 1

    def c10d_all_reduce_input(t):  # the caller's tensor is reduced in place
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
        return t.sum(0)

    def c10d_all_gather_into_tensor(t, out):
        dist.all_gather_into_tensor(out, t * 2, group=group)
        return out.relu()

    def c10d_reduce_scatter_tensor(t, out):
        dist.reduce_scatter_tensor(out, t - 1, group=group)
        return out * 2

    def c10d_broadcast(t):
        t = t + 1
        dist.broadcast(t, src=dist.get_global_rank(group, 0), group=group)
        return t.exp()

    def c10d_all_to_all_single(t, out):
        dist.all_to_all_single(out, t + 2, group=group)
        return out.neg()

    def c10d_all_gather_list(t):
        parts = [torch.empty_like(t) for _ in range(size)]
        dist.all_gather(parts, t.sin(), group=group)
        return torch.cat(parts, 1)

    def explicit_wait(t):  # start, compute meanwhile, wait: the pattern of overlapped TP code
        work = ops.all_reduce(t * 2, "sum", name)
        local = t.cos()
        return ops.wait_tensor(work) + local

    def ops_all_gather_into_tensor(t):
        return ops.wait_tensor(ops.all_gather_into_tensor(t, size, name)) * 3

    return {
        "funcol.all_reduce": (lambda t: funcol.all_reduce(t * 2, "sum", group) + 1, (x,)),
        "funcol.all_reduce(max)": (lambda t: funcol.all_reduce(t.sin(), "max", group) * 2, (x,)),
        "funcol.all_gather_tensor": (lambda t: funcol.all_gather_tensor(t + 1, 0, group) * 2, (x,)),
        "funcol.all_gather(dim 1)": (lambda t: agather(t + 1, 1, group).tanh(), (x,)),
        "funcol.reduce_scatter_tensor": (lambda t: funcol.reduce_scatter_tensor(t + 1, "sum", 0, group) * 2, (x,)),
        "funcol.reduce_scatter(dim 1)": (lambda t: rscatter(t * 5, "sum", 1, group) - 1, (x,)),
        "funcol.all_to_all_single": (lambda t: funcol.all_to_all_single(t + 1, None, None, group) * 2, (x,)),
        "funcol.all_to_all_single(splits)": (
            lambda t: funcol.all_to_all_single(t * 2, recv_splits, send_splits, group) + 1, (x,)),
        "funcol.broadcast": (lambda t: funcol.broadcast(t + 1, size - 1, group) * 2, (x,)),  # src: rank in group
        "wait_tensor(all_reduce) overlapped": (explicit_wait, (x,)),
        "wait_tensor(all_gather_into_tensor)": (ops_all_gather_into_tensor, (x,)),
        "dist.all_reduce(intermediate)": (c10d_all_reduce, (x,)),
        "dist.all_reduce(input, MAX)": (c10d_all_reduce_input, (x,)),
        "dist.all_gather_into_tensor": (c10d_all_gather_into_tensor, (x, torch.zeros(4 * size, 6))),
        "dist.reduce_scatter_tensor": (c10d_reduce_scatter_tensor, (x, torch.zeros(4 // size, 6))),
        # Dynamo does not trace dist.broadcast (torch 2.11-2.13 build BroadcastOptions() in Python): a graph break
        # that runs it eagerly between two graphex graphs, each on the engine. funcol.broadcast is one graph.
        "dist.broadcast (graph break)": (c10d_broadcast, (x,), 2),
        "dist.all_to_all_single": (c10d_all_to_all_single, (x, torch.zeros(4, 6))),
        "dist.all_gather(list)": (c10d_all_gather_list, (x,)),
    }


def run_case(name: str, fn, inputs, graphs: int = 1) -> dict:
    result = {"name": name, "rank": RANK, "expected_engine_runs": graphs * CALLS}
    try:
        eager_in = [t.clone() for t in inputs]
        with torch.no_grad():
            expected = fn(*eager_in)
            expected = funcol.wait_tensor(expected) if isinstance(expected, funcol.AsyncCollectiveTensor) else expected
            compiled = torch.compile(fn, backend="graphex", fullgraph=graphs == 1, dynamic=False)
            before = graphex._C.total_run_count()
            equal, inputs_equal = True, True
            for _ in range(CALLS):
                graph_in = [t.clone() for t in inputs]
                out = compiled(*graph_in)
                equal &= out.dtype == expected.dtype and torch.equal(out, expected)
                inputs_equal &= all(torch.equal(a, b) for a, b in zip(graph_in, eager_in))
            result.update(equal=bool(equal), inputs_equal=bool(inputs_equal),
                          engine_runs=graphex._C.total_run_count() - before)
    except Exception as e:  # reported per case; the peer fails the same case on its side
        result["error"] = f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=-3)}"
    return result


def main() -> None:
    dist.init_process_group("gloo", rank=RANK, world_size=WORLD, timeout=datetime.timedelta(seconds=60))
    groups = {"default group": dist.group.WORLD,
              "subgroup [1, 0]": dist.new_group([1, 0]),
              "subgroup of one rank": dist.new_subgroups(group_size=1)[0]}
    for label, group in groups.items():
        for name, case in cases(group).items():
            torch._dynamo.reset()
            print("CASE " + json.dumps(run_case(f"{name} on {label}", *case)), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
