"""python -m graphex.fusion.serialized --write | --check: the shipped search graphs of the running torch (Note [Built-in
patterns ship as traced graphs], __init__.py). --write traces every built-in group and writes
graphex/fusion/serialized/torch_X_Y.py; --check exits 1 when that file is missing or differs from a fresh trace."""

from __future__ import annotations

import argparse
import os
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m graphex.fusion.serialized", description=__doc__)
    action = parser.add_mutually_exclusive_group(required=True)
    action.add_argument("--write", action="store_true", help="trace every built-in and write this torch's module")
    action.add_argument("--check", action="store_true", help="exit 1 unless this torch's module is up to date")
    args = parser.parse_args(argv)

    from .writer import module_path, render_module, trace_builtins

    text = render_module(trace_builtins())
    path = module_path()
    if args.write:
        tmp = path + ".tmp"
        with open(tmp, "w") as f:
            f.write(text)
        os.replace(tmp, path)
        print(f"wrote {path} ({text.count(chr(10))} lines, {text.count('def _graph_')} graphs)")
        return 0
    old = open(path).read() if os.path.exists(path) else None
    if old == text:
        print(f"{path} is up to date")
        return 0
    print(f"{path} is {'missing' if old is None else 'stale'}: run python -m graphex.fusion.serialized --write",
          file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
