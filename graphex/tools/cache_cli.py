"""`graphex cache ls [DIR]` and `graphex cache clear [DIR]`: look at or empty a compile cache.

DIR defaults to $GRAPHEX_CACHE_DIR, else ./.graphex_cache (cache_compile's default).
"""

from __future__ import annotations

import argparse
import datetime
import os


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("cache", help="list or clear a cache_compile directory", description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    verbs = p.add_subparsers(dest="verb", metavar="VERB")
    ls = verbs.add_parser("ls", help="list entries: what they were built for, size, age")
    ls.add_argument("dir", nargs="?", help="cache directory")
    clear = verbs.add_parser("clear", help="delete every entry (and leftover temporary files)")
    clear.add_argument("dir", nargs="?", help="cache directory")
    p.set_defaults(run=run)


def _directory(args: argparse.Namespace) -> str:
    from graphex.inference.cache_compile import DEFAULT_DIR

    return args.dir or os.environ.get("GRAPHEX_CACHE_DIR") or DEFAULT_DIR


def run(args: argparse.Namespace) -> int:
    if args.verb is None:
        print("usage: graphex cache {ls,clear} [DIR]")
        return 2
    directory = _directory(args)
    if not os.path.isdir(directory):
        print(f"{directory}: no cache here")
        return 0 if args.verb == "clear" else 1
    return _ls(directory) if args.verb == "ls" else _clear(directory)


def _ls(directory: str) -> int:
    from graphex.inference.entry import SUFFIX, EntryError, read_header

    names = sorted(n for n in os.listdir(directory) if n.endswith(SUFFIX) and not n.startswith(".tmp-"))
    if not names:
        print(f"{directory}: empty")
        return 0
    now = datetime.datetime.now(datetime.timezone.utc)
    total = 0
    print(f"{directory}: {len(names)} entr{'y' if len(names) == 1 else 'ies'}")
    for name in names:
        path = os.path.join(directory, name)
        size = os.path.getsize(path)
        total += size
        try:
            h = read_header(path)
        except EntryError as e:
            print(f"  {name}  {_size(size)}  UNUSABLE: {e} (it will be rebuilt on next use)")
            continue
        fn = h.get("function", {})
        created = datetime.datetime.fromisoformat(h["created"]) if "created" in h else None
        age = _age(now - created) if created else "?"
        print(f"  {name}  {_size(size)}  {age} old")
        print(f"    {fn.get('module', '?')}.{fn.get('qualname', '?')}{h.get('signature', '')}")
        world = (h.get("key_parts") or {}).get("world")
        if world:  # Note [A program belongs to its world]: only this world loads it
            from graphex.distributed import describe_world

            print(f"    built for {describe_world(world)}")
        print(f"    {h.get('num_ops', '?')} ops, graphex {h.get('graphex')}, torch {h.get('torch')}, "
              f"compiled in {h.get('compile_seconds', '?')} s; depends on {len(h.get('sources', []))} source "
              f"file(s), {len(h.get('custom_ops', []))} custom op(s)")
    print(f"  total {_size(total)}  (graphex inspect PATH shows an entry's program, bindings and key)")
    return 0


def _clear(directory: str) -> int:
    from graphex.inference.entry import SUFFIX

    removed = 0
    for name in os.listdir(directory):
        if name.endswith(SUFFIX):
            os.unlink(os.path.join(directory, name))
            removed += 1
    print(f"{directory}: removed {removed} entr{'y' if removed == 1 else 'ies'}")
    return 0


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


def _age(delta: datetime.timedelta) -> str:
    s = int(delta.total_seconds())
    if s < 120:
        return f"{s} s"
    if s < 7200:
        return f"{s // 60} min"
    if s < 172800:
        return f"{s // 3600} h"
    return f"{s // 86400} days"
