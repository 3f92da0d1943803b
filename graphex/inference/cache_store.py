"""A cache directory's entries, for CachedFunction (cache_compile.py): the entries of one key, loading one (checked
against its key, versions, sources and custom ops), writing one whole and removing the stale ones it replaces, and the
scan that explains a miss by entries built in other worlds.

An entry's file is `<function>-<key[:24]>-<guards digest[:12]>.gxc` in the cache directory: one per set of guards
(Note [cache_compile keys on what the trace read], Note [A dynamic entry carries its shape guards]). Reading and
writing the file itself is entry.py's (Note [Cache files are written whole or not at all], Note [A cache file is
loaded only when it is provably the user's own])."""

from __future__ import annotations

import contextlib
import glob
import os
from typing import Any, Callable

from ..base.warn import warn_once
from ..distributed import describe_world, world_key, world_mismatch
from . import keys
from .entry import SUFFIX, Entry, EntryError, read_entry, write_entry
from .loaded import Loaded


def candidates(prefix: str) -> list[str]:
    """The entries of one key, one per set of guards: `prefix-<guards digest>.gxc` (Note [cache_compile keys on
    what the trace read], Note [A dynamic entry carries its shape guards])."""
    found = glob.glob(glob.escape(prefix) + "-*" + SUFFIX)
    return sorted(found, key=lambda p: -_mtime(p))  # the newest first, as Dynamo tries its newest cache entry first


def entry_path(prefix: str, entry: Entry) -> str:
    """Where an entry of the key `prefix` names is written: one file per set of guards, so entries of one key traced
    with other values sit side by side (Note [cache_compile keys on what the trace read]; with dynamic=True, also its
    shape guards), and so do entries whose parameters or buffers have other layouts (the arguments' own are in the
    key)."""
    digest = keys.digest([entry.header.get("guards"), entry.header["dynamo_guards"], entry.header.get("graph_inputs")])
    return f"{prefix}-{digest[:12]}{SUFFIX}"


def load(path: str, key: str, func: Callable[..., Any]) -> tuple[Loaded | None, str]:
    """The entry at `path` bound to this process, or (None, why not): no file, another key or version, stale sources
    or custom ops (why starts with "stale"), or an unusable file (warned once; it is rebuilt and replaced)."""
    if not os.path.exists(path):
        return None, "no entry yet"
    try:
        entry = read_entry(path)
        header = entry.header
        if header.get("key_parts") is None or keys.digest(header["key_parts"]) != key:
            other_world = world_mismatch(header.get("key_parts", {}).get("world"), world_key())
            raise EntryError(other_world or "built for another key")
        for name, value in keys.versions().items():
            if header.get(name) != value:
                raise EntryError(f"built with {name} {header.get(name)}, this is {value}")
        stale = (keys.check_sources(header.get("sources", []), keys.project_root(func))
                 or keys.check_custom_ops(header.get("custom_ops", [])))
        if stale:
            return None, f"stale: {stale}"
        other = keys.check_source_state(header.get("sources", []), keys.project_root(func))
        if other:  # Note [A changed global is another state, not a stale entry]: kept for the processes it fits
            return None, f"built in another state: {other}"
        return Loaded(entry, func, path), ""
    except (EntryError, KeyError, TypeError, ValueError, RuntimeError, AttributeError, IndexError) as e:
        warn_once(f"cache-bad:{path}", f"graphex cache: ignoring {path}: {e}. It will be rebuilt and replaced.")
        return None, f"unusable entry ({e})"


def write(cache_dir: str, path: str, entry: Entry, stale: list[str]) -> bool:
    """Write `entry` to `path` (whole or not at all), then remove the `stale` entries of its key (built from other
    sources: never loadable again here); False, warned once, where the directory cannot be written."""
    try:
        os.makedirs(cache_dir, mode=0o700, exist_ok=True)  # Note [A cache file is loaded only when ...]
        write_entry(path, entry)
    except OSError as e:
        warn_once(f"cache-unwritable:{cache_dir}",
                  f"graphex cache: cannot write to {cache_dir} ({e.strerror}); running without the "
                  "cache. Set cache_dir= or GRAPHEX_CACHE_DIR to a writable directory.")
        return False
    for old in stale:
        if old != path:
            with contextlib.suppress(OSError):
                os.remove(old)
    return True


def other_worlds(cache_dir: str, name: str, parts: dict[str, Any]) -> str | None:
    """On a miss: entries of this very call built in other worlds (ranks, world sizes, group layouts) are not loaded;
    say so once (Note [A program belongs to its world], graphex/distributed.py)."""
    mine = keys.digest({k: v for k, v in parts.items() if k != "world"})
    worlds = []
    for path in sorted(glob.glob(os.path.join(glob.escape(cache_dir), f"{glob.escape(name)}-*{SUFFIX}")))[:32]:
        try:
            built = read_entry(path).header.get("key_parts") or {}
        except EntryError:
            continue
        if keys.digest({k: v for k, v in built.items() if k != "world"}) == mine and \
                not _same_world_or_sibling(built.get("world"), parts["world"]):
            worlds.append(describe_world(built.get("world")))
    if not worlds:
        return None
    why = (f"this process is {describe_world(parts['world'])}; the entries of {name} in {cache_dir} "
           f"for this call were built for {'; '.join(sorted(set(worlds)))}, and a program never runs in "
           "another world (its collectives name that world's process groups): compiling one for this world")
    warn_once(f"cache-world:{cache_dir}:{name}", f"graphex cache: {why}.")
    return why


def _same_world_or_sibling(built: Any, here: Any) -> bool:
    """The entry of this world, or of another rank of it (expected in a cache directory the ranks share)."""
    if built is None or here is None:
        return built is here
    return built == here or (built["rank"] != here["rank"] and built["world_size"] == here["world_size"]
                             and built["backend"] == here["backend"])


def _mtime(path: str) -> float:
    try:
        return os.stat(path).st_mtime
    except OSError:
        return 0.0
