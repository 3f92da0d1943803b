"""`graphex export TARGET PATH`: write what a C++ program loads (graphex::Module::load, graphex-run).

TARGET names a function that takes no arguments and returns (model_or_fn, example_inputs):
`FILE.py:FUNC` or `package.module:FUNC`. PATH is the artifact directory (program.gxp and
weights.safetensors), the same as graphex.export(model_or_fn, example_inputs, PATH).

  graphex export model.py:make model.graphex
  graphex-run model.graphex --inputs x.safetensors --output y.safetensors
"""

from __future__ import annotations

import argparse
import json


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("export", help="write a model's program and weights for the C++ runtime (graphex-run)",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("target", metavar="TARGET", help="FILE.py:FUNC or module:FUNC; FUNC() returns (model, example_inputs)")
    p.add_argument("path", metavar="PATH", help="the artifact directory to write")
    p.add_argument("--dynamic", action="store_true", help="dynamic shapes (as torch.compile(dynamic=True))")
    p.add_argument("--option", action="append", default=[], metavar="NAME=VALUE",
                   help="a backend option (see `graphex options`); VALUE is JSON (True, False and None also), else a string")
    p.set_defaults(run=run)


def _load_target(target: str):
    import importlib
    import importlib.util
    import os
    import sys

    where, sep, name = target.rpartition(":")
    if not sep or not where or not name:
        raise SystemExit(f"graphex export: TARGET must be FILE.py:FUNC or module:FUNC, not {target!r}")
    if where.endswith(".py"):
        spec = importlib.util.spec_from_file_location(os.path.splitext(os.path.basename(where))[0], where)
        if spec is None or not os.path.exists(where):
            raise SystemExit(f"graphex export: no file {where}")
        module = importlib.util.module_from_spec(spec)
        sys.path.insert(0, os.path.dirname(os.path.abspath(where)))
        spec.loader.exec_module(module)  # type: ignore[union-attr]
    else:
        module = importlib.import_module(where)
    func = getattr(module, name, None)
    if not callable(func):
        raise SystemExit(f"graphex export: {where} has no function {name}")
    made = func()
    if not (isinstance(made, tuple) and len(made) == 2):
        raise SystemExit(f"graphex export: {target}() must return (model_or_fn, example_inputs)")
    return made


def _options(pairs: list[str]) -> dict:
    options = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise SystemExit(f"graphex export: --option {pair!r}: write NAME=VALUE")
        try:
            options[key] = json.loads(value)
        except ValueError:  # Python's spellings of the JSON constants too (`--option pattern_fusion_pass=True`)
            options[key] = {"True": True, "False": False, "None": None}.get(value, value)
    return options


def run(args: argparse.Namespace) -> int:
    import graphex
    from graphex.errors import GraphexError

    model, example_inputs = _load_target(args.target)
    try:
        path = graphex.export(model, tuple(example_inputs), args.path, dynamic=args.dynamic,
                              options=_options(args.option) or None)
    except GraphexError as e:
        print(f"graphex export: {e}")
        return 1
    print(f"wrote {path} (program.gxp, weights.safetensors)")
    return 0
