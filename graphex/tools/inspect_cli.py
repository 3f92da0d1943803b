"""`graphex inspect PATH`: print a graphex file readably.

PATH is an export directory (graphex.export / graphex export), its program.gxp, or a
cache_compile entry (.gxc): the program (operators, inputs and where each comes from:
argument, parameter or buffer by name, size of an argument), the result's leaves and
tree, the weights (export) and what it was built for (versions, signature, options,
world, sources, custom ops). Note [One artifact for cache and deploy]
(graphex/tools/inspecting.py).
"""

from __future__ import annotations

import argparse
import sys


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("inspect", help="print an exported artifact or a cache entry readably", description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("path", help="export directory, program.gxp, or cache entry (.gxc)")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from graphex.tools.inspecting import InspectError, describe

    try:
        lines = describe(args.path)
    except InspectError as e:
        print(f"graphex inspect: {e}", file=sys.stderr)
        return 1
    print("\n".join(lines))
    return 0
