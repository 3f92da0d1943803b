"""Writing a file whole or not at all: a temporary file in the same directory, then a rename.

Readers see the old content or the new one, never a mix; a crash leaves no half-written
file behind (only, at worst, a `.tmp-*` file that the next writer does not read).
"""

from __future__ import annotations

import os
import tempfile


def write_atomic(path: str, data: bytes | str, *, durable: bool = False, mode: int | None = None) -> None:
    """Replace `path` with `data`. durable=True also fsyncs, for files other processes rely on. `mode`: the
    file's permissions (default: the usual ones, 0666 less the umask)."""
    directory = os.path.dirname(path) or "."
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-", suffix=os.path.basename(path))
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode("utf-8") if isinstance(data, str) else data)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        os.chmod(tmp, mode if mode is not None else 0o666 & ~_umask())  # mkstemp makes 0600
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
