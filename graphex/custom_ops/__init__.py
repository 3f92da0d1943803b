"""Custom operators in graphex graphs: how they were registered, what can go wrong, and the fix.

registration.py  which of the three registration paths an op came from, and where
fixes.py         the code to paste, in that path's style
checks.py        the checks: at trace time (fake/Meta present and on `meta`), on the
                 Dynamo graph (schema rules), and on the first replay (fake vs real)
"""

from __future__ import annotations

from ..base.lazy import lazy_names

# Imported on first use (PEP 562): a cache hit reads registration.py's descriptions for its key
# (Note [A cache hit imports no compiler]); checks.py imports Dynamo.
_PUBLIC = {"Registration": "registration", "describe": "registration", "is_custom": "registration",
           "check_dynamo_graph": "checks", "explain_fake_mismatch": "checks", "install_trace_checks": "checks",
           "reset_dynamo": "checks"}
__all__ = list(_PUBLIC)


__getattr__ = lazy_names(__name__, _PUBLIC)
