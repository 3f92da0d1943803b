"""Custom operators in graphex graphs: how they were registered, what can go wrong, and the fix.

registration.py  which of the three registration paths an op came from, and where
fixes.py         the code to paste, in that path's style
checks.py        the checks: at trace time (fake/Meta present and on `meta`), on the
                 Dynamo graph (schema rules), and on the first replay (fake vs real)
"""

from .checks import check_dynamo_graph, explain_fake_mismatch, install_trace_checks, reset_dynamo
from .registration import Registration, describe, is_custom

__all__ = ["Registration", "describe", "is_custom", "check_dynamo_graph", "explain_fake_mismatch",
           "install_trace_checks", "reset_dynamo"]
