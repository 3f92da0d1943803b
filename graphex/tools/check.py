"""`graphex check`: my op works in eager but not in graph mode — find out why, from your own run.

    graphex check SCRIPT [-- ARGS...] [--entry FUNC] [--case OP#N] [--json]

Runs SCRIPT in eager (as __main__ with sys.argv = [SCRIPT, *ARGS], or imports it and calls
FUNC()), records every call to a custom operator with its real arguments (up to --max-cases
distinct input signatures per op), then checks each op on those calls:

  1 fake_exists          a fake/Meta function exists (if not, one is inferred from the kernel)
  2 fake_matches         the fake gives the real outputs' shape, dtype, device (and strides)
  3 mutations_declared   the kernel writes exactly the inputs the schema marks (a!) / mutates_args
  4 no_output_alias      no output is an input or a view of one; no mutated input is returned
  5 fake_reads_no_data   the fake never reads tensor values (.item(), .tolist(), numpy)
  6 graph_matches_eager  the op compiled with graphex equals eager; torch.library.opcheck passes

Each failure names the op, the check, what was expected and seen, a case id (OP#N, the op's
N-th recorded call) that `--case` re-runs alone, and the fix in your registration style.
Exit status: 0 all checks pass, 1 problems found, 2 the script failed (its traceback is shown,
and the ops it called before failing are still checked).
"""
# The checking code lives in graphex/tools/checking/.

from __future__ import annotations

import argparse
import contextlib
import sys


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("check", help="check your custom ops on the calls your own eager script makes",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.__class__ = _SplitAtDashDash  # see its docstring
    p.add_argument("script", metavar="SCRIPT", help="the Python script that calls your ops in eager")
    p.add_argument("script_args", nargs="*", metavar="ARGS", help="after --: the script's own arguments")
    p.add_argument("--entry", metavar="FUNC", help="import SCRIPT and call FUNC() instead of running it as __main__")
    p.add_argument("--case", metavar="OP#N", help="check only this recorded call (as printed, e.g. mylib::foo#2)")
    p.add_argument("--max-cases", type=int, default=3, metavar="N",
                   help="distinct calls recorded per op (default: 3)")
    p.add_argument("--json", action="store_true", help="print a machine-readable report instead of text")
    p.set_defaults(run=run)


class _SplitAtDashDash(argparse.ArgumentParser):
    """Everything after the first `--` belongs to the script. Plain argparse fills the optional
    positional ARGS as soon as SCRIPT is seen, so `SCRIPT --json -- 5` would leave `5` unrecognized."""

    def parse_known_args(self, args=None, namespace=None):  # type: ignore[override]
        args = list(sys.argv[1:] if args is None else args)
        rest: list[str] = []
        if "--" in args:
            args, rest = args[:args.index("--")], args[args.index("--") + 1:]
        ns, extras = super().parse_known_args(args, namespace)
        ns.script_args = list(ns.script_args or []) + rest
        return ns, extras


def run(args: argparse.Namespace) -> int:
    from .checking import report as reporting
    from .checking import suite
    from .checking.record import ScriptFailed, run_script

    report = reporting.Report(args.script, list(args.script_args), args.entry)
    print(f"graphex check: running {args.script} in eager, recording custom-op calls", file=sys.stderr)
    try:
        with contextlib.redirect_stdout(sys.stderr):  # stdout is the report; the script's prints go to stderr
            recording = run_script(args.script, list(args.script_args), args.entry, max(1, args.max_cases))
    except ScriptFailed as e:
        report.traceback = str(e)
        if e.failed_in is not None:
            report.failed_in = suite.explain_failure(*e.failed_in, str(e))
        if e.recording is not None and any(e.recording.calls.values()):
            suite.run(e.recording, report, case=args.case)  # what it called before failing is checked too
    if not report.traceback:
        if args.case is not None and not any(c.case_id == args.case for cs in recording.calls.values() for c in cs):
            known = ", ".join(c.case_id for cs in recording.calls.values() for c in cs) or "none"
            print(f"graphex check: no case {args.case} in this run; recorded cases: {known}", file=sys.stderr)
            return 2
        suite.run(recording, report, case=args.case)
    print(reporting.as_json(report) if args.json else reporting.text(report), end="" if not args.json else "\n")
    return report.exit_code
