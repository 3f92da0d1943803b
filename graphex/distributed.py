"""graphex and torch.distributed: what a program's collectives depend on, and how they fail.

A captured graph calls functional collectives (`_c10d_functional::all_reduce(t, "sum", "0")`,
then `wait_tensor`); the engine replays them as dispatcher calls like any other op. The group
is named by a string ('0' is the default group, new groups count up in creation order), so a
program is only valid in a world where those names mean the same ranks.

Note [A program belongs to its world]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
cache_compile keys an entry on `world_key()`: this process's rank, the world size, the
backend and every process group it belongs to (name -> global ranks in group order). An
entry built by rank 1, by a world of another size, or by a script that created its groups
in another order is never loaded here; each rank of one script writes and finds its own
entry in a shared cache directory. `describe_world` is the text of the refusal.

Note [A collective that fails names its peers]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
When a peer rank dies, gloo's wait fails at once ("Connection closed by peer"); when a peer
never arrives, it fails after the process group's timeout. Either way the engine raises a
ReplayError at the wait_tensor (or collective) node; `collective_failure` adds which
collective, which group and ranks, this rank, the timeout that bounded the wait and how to
set it (torch's own knob: init_process_group(timeout=...) / new_group(timeout=...)).
"""

from __future__ import annotations

from typing import Any

from . import compat

# The operator namespaces of collectives (the one table: replay errors, export's refusal). "c10d_functional::" is
# the pre-2.2 spelling torch still registers.
COLLECTIVE_NAMESPACES = ("_c10d_functional::", "c10d_functional::", "c10d::", "_dtensor::")


def is_collective(op: str) -> bool:
    """Whether 'ns::name.overload' is a collective (its namespace is in COLLECTIVE_NAMESPACES)."""
    return op.startswith(COLLECTIVE_NAMESPACES)


def _initialized() -> bool:
    try:
        import torch.distributed as dist
    except ImportError:  # pragma: no cover - torch built without distributed
        return False
    return dist.is_available() and dist.is_initialized()


def world_key() -> dict[str, Any] | None:
    """What a program's collectives assume about the world (Note [A program belongs to its world]);
    None in a process without torch.distributed initialized."""
    if not _initialized():
        return None
    import torch.distributed as dist

    groups = [[name, list(dist.get_process_group_ranks(pg))] for name, pg in compat.process_groups()]
    return {"rank": dist.get_rank(), "world_size": dist.get_world_size(), "backend": str(dist.get_backend()),
            "groups": groups}


def describe_world(key: dict[str, Any] | None) -> str:
    if key is None:
        return "a single process (no torch.distributed process group)"
    groups = ", ".join(f"'{name}': {ranks}" for name, ranks in key.get("groups", []))
    return f"rank {key['rank']} of world size {key['world_size']} ({key['backend']}; groups {groups})"


def world_mismatch(built_for: dict[str, Any] | None, here: dict[str, Any] | None) -> str | None:
    """Why a program built for `built_for` must not run in `here`, or None when the worlds agree."""
    if built_for == here:
        return None
    return (f"built for {describe_world(built_for)}; this process is {describe_world(here)}. A program's "
            "collectives name the process groups of the world it was traced in, so it never runs in another")


def collective_failure(gm: Any, node: str) -> tuple[str, str]:
    """(why, fix) for a collective or wait_tensor that failed at replay, `node` of the torch.fx GraphModule `gm`
    (None when the graph is not known: an entry of the compile cache) (Note [A collective that fails names
    its peers])."""
    collective, group_name = _collective_of(gm, node)
    where = "this rank"
    timeout = None
    if _initialized():
        import torch.distributed as dist

        where = f"rank {dist.get_rank()} of world size {dist.get_world_size()}"
        pg = compat.process_group_by_name(group_name) if group_name is not None else None
        if pg is not None:
            collective += f" over group '{group_name}' (ranks {list(dist.get_process_group_ranks(pg))})"
            timeout = compat.process_group_timeout(pg)
    bound = f"the group's timeout ({timeout.total_seconds():g} s)" if timeout is not None else "the group's timeout"
    why = (f"{collective} did not complete on {where}: another rank of the group exited or crashed, or did not "
           f"reach this collective within {bound}. Every rank must run the same compiled step, with the same "
           "collectives in the same order")
    fix = ("look at the other ranks' output for their own error first. The wait is bounded by the process "
           "group's timeout: init_process_group(..., timeout=datetime.timedelta(seconds=60)) (or "
           "new_group(..., timeout=...)) makes a missing rank an error after 60 s")
    return why, fix


def _collective_of(gm: Any, node: str) -> tuple[str, str | None]:
    """('the collective all_reduce', group name) for the failed node: a wait_tensor is traced back to the
    collective it waits for."""
    target = next((n for n in gm.graph.nodes if n.name == node), None) if gm is not None else None
    while target is not None and "wait_tensor" in str(target.target) and target.args:
        target = target.args[0] if hasattr(target.args[0], "target") else None
    if target is not None and hasattr(target.target, "_schema"):
        schema = target.target._schema
        names = [a.name for a in schema.arguments]
        group = target.args[names.index("group_name")] if "group_name" in names[:len(target.args)] else None
        return f"the collective {schema.name.split('::')[-1]}", group if isinstance(group, str) else None
    return "a collective", None
