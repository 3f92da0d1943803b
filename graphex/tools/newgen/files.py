"""Write generated files: never over existing files unless forced, each one atomically."""

from __future__ import annotations

import os
from dataclasses import dataclass

from graphex.base.atomic import write_atomic

from .spec import SkeletonError


@dataclass(frozen=True)
class File:
    name: str     # relative to the output directory
    text: str
    about: str    # one line for the summary `graphex new` prints


def write_all(out_dir: str, files: list[File], *, force: bool = False) -> list[str]:
    """Write files into out_dir (created if needed); returns their paths.

    Checks every target first, so a refusal writes nothing. Each file is written whole or
    not at all (graphex.base.atomic: a temporary file renamed over the target).
    """
    paths = [os.path.join(out_dir, f.name) for f in files]
    existing = [p for p in paths if os.path.lexists(p)]
    if existing and not force:
        raise SkeletonError("graphex new: refusing to overwrite " + ", ".join(existing) +
                            "\nPass --force to replace them, or --out DIR to write elsewhere.")
    try:
        os.makedirs(out_dir, exist_ok=True)
        for path, f in zip(paths, files):
            write_atomic(path, f.text)
    except OSError as e:
        raise SkeletonError(f"graphex new: cannot write to {out_dir}: {e}") from None
    return paths
