"""One-time warnings: each distinct message key is reported once per process, at the user's line.

Note [A warning points at the user's line, once]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
A warning raised from deep inside graphex (or inside torch.compile, which calls
graphex) would otherwise be attributed to a graphex or torch source line. The
stack level given to warnings.warn is that of the first frame outside graphex,
torch and the standard library: the user's call. Each key is warned once per
process, and only as a warning: with GRAPHEX_LOG on, the log does not print the
same text a second time.
"""

from __future__ import annotations

import os
import sys
import warnings

_seen: set[str] = set()

_GRAPHEX_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # graphex/
_STDLIB_DIR = os.path.dirname(os.path.abspath(os.__file__))


class GraphexWarning(UserWarning):
    """Category of every warning graphex emits (filter with warnings.filterwarnings)."""


def warn_once(key: str, message: str) -> None:
    if key in _seen:
        return
    _seen.add(key)
    warnings.warn(message, GraphexWarning, stacklevel=_user_stacklevel())


def _user_stacklevel() -> int:
    """The stacklevel (for a warnings.warn in warn_once) of the first frame outside graphex, torch and
    the standard library; 2 (warn_once's caller) when there is none."""
    internal = [_GRAPHEX_DIR, _STDLIB_DIR]
    torch_mod = sys.modules.get("torch")
    if torch_mod is not None and getattr(torch_mod, "__file__", None):
        internal.append(os.path.dirname(os.path.abspath(torch_mod.__file__)))
    frame, level = sys._getframe(2), 2  # warn_once's caller is level 2
    while frame is not None:
        filename = frame.f_code.co_filename
        if not filename.startswith("<") and not any(filename.startswith(d + os.sep) for d in internal):
            return level
        frame, level = frame.f_back, level + 1
    return 2


def reset() -> None:
    """Forget which warnings were shown (tests)."""
    _seen.clear()


# Note [No DeprecationWarnings from importing graphex]
# graphex reuses inductor's passes, whose import chain loads torch.utils.mkldnn, which calls the
# deprecated torch.jit.script_method while defining its classes: a DeprecationWarning per class on
# every `import graphex`, shown by pytest in every user's (and every generated) test run. They are
# torch's own and say nothing to the user, so that one module is imported once with them silenced.
_TORCH_IMPORT_NOISE = ("torch.utils.mkldnn",)


def import_torch_quietly() -> None:
    import importlib

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="`torch.jit.script_method` is deprecated",
                                category=DeprecationWarning)
        for name in _TORCH_IMPORT_NOISE:
            try:
                importlib.import_module(name)
            except ImportError:
                pass
