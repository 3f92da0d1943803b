"""`graphex options`: print every backend option with its default and meaning (Markdown)."""

from __future__ import annotations

import argparse


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("options", help="list the backend's options (a Markdown table)",
                       description=__doc__)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from graphex.options import option_docs

    print("| option | default | meaning |")
    print("|---|---|---|")
    for name, default, doc in option_docs():
        print(f"| `{name}` | `{default!r}` | {doc} |")
    return 0
