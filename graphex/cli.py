"""The `graphex` command line (also `python -m graphex`).

    graphex new ...      op skeletons and minimal reproducers     (tools/new.py)
    graphex check ...    validate your custom ops from your own eager run (tools/check.py)
    graphex triage ...   explain graph breaks, recompiles, copies, accuracy (tools/triage.py)
    graphex cache ...    list or clear compile caches             (tools/cache_cli.py)
    graphex options      the backend's options and what they do

Each subcommand lives in its own module with `add_parser(subparsers)` and
`run(args) -> int` (the process exit code).
"""

from __future__ import annotations

import argparse
import importlib
import sys

# subcommand -> module under graphex.tools (imported only when used: torch is slow to import)
_COMMANDS = {
    "new": "graphex.tools.new",
    "check": "graphex.tools.check",
    "triage": "graphex.tools.triage",
    "cache": "graphex.tools.cache_cli",
    "options": "graphex.tools.options_cli",
}


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="graphex", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, module_name in _COMMANDS.items():
        if only is not None and name != only:
            sub.add_parser(name, help=f"(see graphex {name} --help)")
            continue
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as e:
            if e.name != module_name:
                raise
            continue  # not built yet
        module.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command = argv[0] if argv and not argv[0].startswith("-") else None
    parser = build_parser(only=command if command in _COMMANDS else None)
    args = parser.parse_args(argv)
    if getattr(args, "run", None) is None:
        parser.print_help()
        return 0 if command is None else 2
    return int(args.run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
