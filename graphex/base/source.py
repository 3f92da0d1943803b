"""Where an FX node came from in the user's code, for error messages and dumps."""

from __future__ import annotations

import re

import torch.fx

_TORCH_DISTRIBUTED = "/torch/distributed/"
_FRAME = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<fn>\S+)\n\s*(?P<code>[^\n]*)')


def user_frame(node: torch.fx.Node) -> tuple[str, int, str, str] | None:
    """(file, line, function, code) of the innermost user frame that produced `node`."""
    trace = node.meta.get("stack_trace")
    if not trace:
        return None
    frames = list(_FRAME.finditer(trace))
    if not frames:
        return None
    # A collective is traced through torch.distributed's Python wrappers (dist.all_reduce -> functional
    # collective -> wait_tensor); the user's line is the call into them, not torch's own lines.
    m = next((f for f in reversed(frames) if _TORCH_DISTRIBUTED not in f["file"].replace("\\", "/")), frames[-1])
    return m["file"], int(m["line"]), m["fn"], m["code"].strip()


def source_line(node: torch.fx.Node) -> str:
    """'model.py:42 in forward: y = self.fc(x)', or '' when the node has no stack trace."""
    frame = user_frame(node)
    if frame is None:
        return ""
    file, line, fn, code = frame
    return f"{file}:{line} in {fn}: {code}"


_SOURCE_PARTS = [
    (re.compile(r"^[LG]\['([^']+)'\]"), r"\1"),
    (re.compile(r"\._(?:modules|parameters|buffers)\['([^']+)'\]"), r".\1"),
    (re.compile(r"\.__self__"), ""),
    (re.compile(r"\['([^']+)'\]"), r"[\1]"),
]


def pretty_source(name: str) -> str:
    """Dynamo's source of a graph input, as the user wrote it: L['self']._modules['fc']._parameters['weight']
    becomes self.fc.weight, L['cache'] becomes cache."""
    for pattern, repl in _SOURCE_PARTS:
        name = pattern.sub(repl, name)
    return name


def display_name(node: torch.fx.Node) -> str:
    """The user's name for a graph input when known (set at capture), else the FX node's name."""
    return node.meta.get("graphex_user_name") or node.name
