"""graphex: tools for getting a model, and its custom operators, into torch.compile's graph mode.

  graphex new op NS::NAME     start a custom op that works in graph mode: the op, a reproducer, a test
  graphex new mre [--cache]   write a minimal reproducer (plain torch.compile, or cache_compile)
  graphex check SCRIPT        my op works in eager, not in graph mode: check every custom op SCRIPT calls
  graphex triage SCRIPT       it compiles but something is wrong: graph breaks, recompiles, accuracy
  graphex export TARGET PATH  write a model's program and weights for C++ (graphex-run, graphex::Module)
  graphex cache ls|clear      list or clear the cache_compile directory
  graphex inspect PATH        print an exported artifact or a cache entry: program, bindings, weights, key
  graphex options             the backend's options and what they do

Run `graphex COMMAND --help` for a command's options. Also `python -m graphex`.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# Note [graphex --help does not import torch]
# Each subcommand lives in its own module under graphex.tools with `add_parser(subparsers)`
# and `run(args) -> int`; a module imports torch only inside `run`, so building the parser
# is cheap, and `import graphex` imports nothing (Note [import graphex is quiet]): so
# `graphex --help` and `graphex COMMAND --help` answer at once; torch takes seconds to import.

# subcommand -> module under graphex.tools (imported only when used)
_COMMANDS = {
    "new": "graphex.tools.new",
    "check": "graphex.tools.check",
    "triage": "graphex.tools.triage",
    "export": "graphex.tools.export_cli",
    "cache": "graphex.tools.cache_cli",
    "inspect": "graphex.tools.inspect_cli",
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
