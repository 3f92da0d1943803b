"""Readable dumps of captured graphs (option dump_dir / GRAPHEX_DUMP=dir).

Per graph: <name>.py, the optimized ATen graph as Python code with the user's
source lines, the copies kept and why; <name>.plan.txt, the engine's program
(slots, moves, frees). Files are written whole (temp file + rename).

A directory that cannot be written (GRAPHEX_DUMP pointing under a file, no
permission) never fails the compile: one GraphexWarning per directory says so.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from ..base import log as _log
from ..base.warn import warn_once
from ..base.atomic import write_atomic

if TYPE_CHECKING:
    from .compiled_graph import CompiledGraph


def dump_graph(directory: str, compiled: "CompiledGraph") -> None:
    try:
        os.makedirs(directory, exist_ok=True)
        header = [
            f"# graphex capture {compiled.name}: {compiled.num_ops} ops, {compiled.num_outputs} outputs"
            + (", dynamic shapes" if compiled.dynamic else ""),
            f"# options: { {k: v for k, v in vars(compiled.options).items() if v is not None} }",
        ]
        for copy in compiled.kept_copies:
            header.append(f"# {copy}")
        write_atomic(os.path.join(directory, f"{compiled.name}.py"), "\n".join(header) + "\n\n" + compiled.code())
        write_atomic(os.path.join(directory, f"{compiled.name}.plan.txt"), compiled.plan())
        _log.info("%s: dumped to %s", compiled.name, directory)
    except OSError as e:
        warn_once(f"dump:{directory}", f"graphex: cannot write graph dumps to {directory!r} "
                  f"({e.strerror or e}); the model runs as usual, without dumps. Set dump_dir= or "
                  f"GRAPHEX_DUMP to a writable directory.")
