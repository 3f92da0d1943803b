"""torch.distributed's internals: the process groups of this process."""

from __future__ import annotations

from typing import Any

import torch


# -- torch.distributed: the process groups of this process ---------------------------------------

def process_groups() -> list[tuple[str, Any]]:
    """(name, ProcessGroup) of every group this process belongs to. Names are what functional
    collectives carry in a graph ('0' is the default group). `_world.pg_names` exists in 2.11-2.15."""
    from torch.distributed import distributed_c10d as c10d

    return sorted(((name, pg) for pg, name in c10d._world.pg_names.items()), key=lambda item: item[0])


def process_group_by_name(name: str) -> Any:
    """The ProcessGroup a functional collective's group name resolves to, or None."""
    from torch.distributed import distributed_c10d as c10d

    try:
        return c10d._resolve_process_group(name)
    except (KeyError, RuntimeError, ValueError):
        return None


def process_group_timeout(pg: Any) -> Any:
    """The timeout (datetime.timedelta) the group's CPU backend waits for its peers, or None."""
    try:
        return pg._get_backend(torch.device("cpu")).options._timeout
    except (AttributeError, RuntimeError):
        return None
