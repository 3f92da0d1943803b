"""`graphex triage`: run a script's model under graphex and explain what went wrong, with fixes.

    graphex triage SCRIPT [--entry FUNC] [--json] [--no-bisect] [-- SCRIPT_ARGS...]

The script runs as written (or, with --entry, is imported and FUNC() called; FUNC may also
return (model_or_fn, args) to have triage compile it the MRE way). Every torch.compile call
it makes is recorded with its options and first inputs. Reported, each with the user's
source line and a fix:

  graph breaks      every break of each compiled function and its reason (a fullgraph=True
                    compile stops at the first; triage re-traces with fullgraph=False)
  recompiles        the guard that failed (a changing Python int, a new shape, ...)
  capture errors    ops graphex cannot capture (CaptureError), custom-op problems (CustomOpError)
  kept copies       in-place updates graphex could not apply (CompiledGraph.kept_copies)
  accuracy          eager vs aot_eager vs graphex force_eager vs graphex replay on the first
                    call's inputs: the first stage that differs, and what that implies

Exit code: 0 nothing found, 1 problems found, 2 the script fails even without graphex.
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .triaging.report import Report

_MAX_BISECTED = 8  # compiled functions bisected per run (each costs four compiles)


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("triage", help="explain graph breaks, recompiles, capture errors, copies, accuracy",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("script", help="the Python script that compiles and runs the model")
    p.add_argument("--entry", metavar="FUNC", help="import the script and call FUNC() instead of running __main__")
    p.add_argument("--json", action="store_true", help="print one JSON document instead of the text report")
    p.add_argument("--no-bisect", action="store_true", help="skip the accuracy bisection")
    p.add_argument("script_args", nargs="*", metavar="ARGS", help="after --: the script's own arguments")
    p.set_defaults(run=run)
    # argparse matches every positional at the first one, so with options between SCRIPT and
    # `-- ARGS` the ARGS would be left over as unrecognized: everything after the first `--`
    # is taken here, before argparse sees it.
    own_parse = p.parse_known_args

    def parse_known_args(args: list[str] | None = None,
                         namespace: argparse.Namespace | None = None) -> tuple[argparse.Namespace, list[str]]:
        args = list(sys.argv[1:] if args is None else args)
        rest: list[str] = []
        if "--" in args:
            cut = args.index("--")
            args, rest = args[:cut], args[cut + 1:]
        ns, extras = own_parse(args, namespace)
        ns.script_args = [*ns.script_args, *rest]
        return ns, extras

    p.parse_known_args = parse_known_args  # type: ignore[method-assign]


def run(args: argparse.Namespace) -> int:
    from .triaging import breaks, capture, recompiles, report, runner
    from .triaging import bisect as bisection
    from .triaging.findings import Finding

    script_args = list(args.script_args)
    if not os.path.isfile(args.script):
        print(f"graphex triage: no such script: {args.script}", file=sys.stderr)
        return 2
    try:
        ran = runner.run_script(args.script, script_args, args.entry)
    except runner.EntryError as e:
        print(f"graphex triage: {e}", file=sys.stderr)
        return 2

    findings: list[Finding] = []
    error = _one_line(ran.error) if ran.error is not None else ""
    if ran.failed_in is not None:
        error += f" (out of call {ran.failed_in.error_call} of {ran.failed_in.name}, at {ran.failed_in.error_call_at})"
    if ran.error is not None:
        eager_error = runner.eager_failure(ran)
        if eager_error is not None:
            return _emit(report.Report(args.script, script_args, args.entry, "failed-in-eager", error, eager_error,
                                       ran.compiled, [], [], 2), args.json)
        if ran.failed_in is None:
            findings.append(Finding("script", f"the script fails under graphex but not in eager: {error}",
                                    where=_user_frame(ran.error),
                                    fix="see the findings below; a failed check of results points to the accuracy "
                                        "bisection"))

    from ..runtime import live_graphs

    findings += capture.kept_copy_findings(live_graphs(), ran.user_copies)  # first: later steps reset Dynamo's caches
    findings += capture.error_findings(ran) + capture.autograd_findings(ran)
    findings += breaks.collect(ran)
    findings += recompiles.collect(ran.events)
    called = [c for c in ran.compiled if c.first_args is not None]
    bisections = [] if args.no_bisect else [bisection.bisect(c) for c in called[:_MAX_BISECTED]]
    findings += [f for f in map(bisection.finding, bisections) if f is not None]
    code = 1 if any(f.problem for f in findings) else 0
    status = "failed" if ran.error is not None else "ran"
    return _emit(report.Report(args.script, script_args, args.entry, status, error, "", ran.compiled, findings,
                               bisections, code), args.json)


def _emit(rep: Report, as_json: bool) -> int:
    from .triaging import report

    sys.stdout.write(report.as_json(rep) if as_json else report.text(rep))
    return rep.exit_code


def _one_line(e: BaseException) -> str:
    from .triaging.findings import first_line

    return f"{type(e).__name__}: {first_line(str(e))}"


def _user_frame(e: BaseException) -> str:
    from .triaging.findings import is_internal, location

    frames = [f for f in traceback.extract_tb(e.__traceback__) if not is_internal(f.filename)]
    if not frames:
        return ""
    f = frames[-1]
    return location(f.filename, f.lineno or 0, f.name, (f.line or "").strip() or None)
