"""`graphex new`: custom-op skeletons and minimal reproducers that run as generated.

    graphex new op NS::NAME --style {custom_op,library,cpp} [--inplace] [--signature SCHEMA]
    graphex new mre [--cache]
    graphex new                 on a terminal: asks what state your op is in and what you need

`op` writes the registration (kernel + fake/Meta function), repro.py and test_NAME.py into
./NAME; `mre` writes one reproducer template per call: repro.py (torch.compile), or with
--cache repro_cache.py (cache_compile). Existing files are kept unless --force.
"""
# The generators live in graphex/tools/newgen/.

from __future__ import annotations

import argparse
import os
import sys

from .newgen.styles import STYLES


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("new", help="custom-op skeletons and minimal reproducers", description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    kinds = p.add_subparsers(dest="kind", metavar="KIND")

    op = kinds.add_parser("op", help="a custom op: registration with its fake/Meta function, repro.py, a test")
    op.add_argument("qualname", metavar="NS::NAME", help="the op, called as torch.ops.NS.NAME")
    op.add_argument("--style", required=True, choices=list(STYLES),
                    help="; ".join(f"{name}: {about}" for name, about in STYLES.items()))
    op.add_argument("--inplace", action="store_true",
                    help="the op writes an input (default signature NAME(Tensor(a!) x) -> ())")
    op.add_argument("--signature", metavar="SCHEMA", help='the schema, e.g. "NAME(Tensor x, Tensor? y, float eps=1e-6) '
                    '-> Tensor" (default: NAME(Tensor x) -> Tensor)')
    op.add_argument("--out", metavar="DIR", help="where to write (default: ./NAME)")
    op.add_argument("--force", action="store_true", help="overwrite existing files")

    mre = kinds.add_parser("mre", help="a minimal reproducer template (repro.py, or repro_cache.py with --cache)")
    mre.add_argument("--cache", action="store_true",
                     help="the compile-cache template (graphex.inference.cache_compile)")
    mre.add_argument("--out", metavar="DIR", default=".", help="where to write (default: .)")
    mre.add_argument("--force", action="store_true", help="overwrite existing files")

    p.set_defaults(run=run, new_help=p.format_help())


def run(args: argparse.Namespace) -> int:
    from .newgen import SkeletonError

    try:
        if args.kind == "op":
            return _op(args.qualname, args.style, args.signature, args.inplace, args.out, args.force)
        if args.kind == "mre":
            return _mre(args.cache, args.out, args.force)
        if not (sys.stdin.isatty() and sys.stdout.isatty()):
            print(args.new_help, end="", file=sys.stderr)
            return 2
        return _interactive()
    except SkeletonError as e:
        print(e, file=sys.stderr)
        return 2


def _op(qualname: str, style: str, signature: str | None, inplace: bool, out: str | None, force: bool) -> int:
    from .newgen import parse_op, plan
    from .newgen.files import write_all

    spec = parse_op(qualname, signature, inplace=inplace)
    files = plan.op_files(spec, style)
    out_dir = out or spec.name
    write_all(out_dir, files, force=force)
    _report(out_dir, files, plan.op_next_steps(spec),
            'Replace the placeholders marked "<your implementation>" and "TODO", then run:')
    return 0


def _mre(cache: bool, out: str, force: bool) -> int:
    from .newgen import plan
    from .newgen.files import write_all

    files = plan.mre_files(cache)
    write_all(out, files, force=force)
    steps = ["python repro_cache.py  # twice: the second run loads the cache"] if cache else ["python repro.py"]
    _report(out, files, steps, 'Fill in the parts marked "<...>", then run:')
    return 0


def _interactive() -> int:
    from .newgen import parse_op, plan, prompts

    try:
        answers = prompts.ask()
    except (EOFError, KeyboardInterrupt):
        print("\ngraphex new: cancelled", file=sys.stderr)
        return 1
    if answers.state == "3":
        print("\nRun your script under the triage tool; it explains graph breaks, recompiles, copies and")
        print("differences from eager, and names the op and line concerned:\n")
        print("  graphex triage YOUR_SCRIPT.py")
        return 0
    if answers.state == "1":
        return _op(answers.qualname, answers.style, answers.signature, answers.inplace, None, False)
    spec = parse_op(answers.qualname, answers.signature, inplace=answers.inplace)
    print(f"\nA graph needs a fake (Meta) function for {spec.qualname}: it gives each output's shape, dtype")
    print("and device, never data. Add this where the op is registered, filling in any TODO:\n")
    print(plan.meta_skeleton(spec, answers.style))
    if answers.style == "custom_op":
        print(f"({spec.name} is the function decorated with @torch.library.custom_op.)")
    if spec.inplace:
        names = ", ".join(a.name for a in spec.mutated)
        declared = f"mutates_args names {names}" if answers.style == "custom_op" else f"schema marks {names} Tensor(a!)"
        print(f"The op writes {names} in place: check that its {declared}, and that it returns none of them.")
    print()
    print("Then check the op from your own eager run:\n\n  graphex check YOUR_SCRIPT.py")
    return 0


def _report(out_dir: str, files: list, steps: list[str], lead: str) -> None:
    shown = os.path.relpath(out_dir)
    shown = out_dir if shown.startswith("..") else shown
    width = max(len(f.name) for f in files)
    print(f"graphex new: wrote {len(files)} file{'s' if len(files) > 1 else ''} in {shown}/")
    for f in files:
        print(f"  {f.name:<{width}}  {f.about}")
    print(lead)
    if shown != ".":
        print(f"  cd {shown}")
    for step in steps:
        print(f"  {step}")
