"""What a cache entry depends on, so that a change to any of it is a miss (never a stale graph).

Note [What the compile cache keys on]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
The entry's file name comes from what is known before tracing:
  * graphex, torch, program-spec and cache-format versions;
  * the function: module, qualified name and defining file's name (two scripts run
    as __main__ both define `Model._forward`), plain values and callables it closes
    over, and for a bound method its module's structure: every submodule's type, every parameter and buffer's name, shape,
    dtype and device, and plain-valued attributes (ints, floats, strings, bools,
    dataclass configs) such as `eps` or `heads`, which get baked into the graph;
  * the options, dynamic=, and grad mode;
  * the world: with torch.distributed initialized, this rank, the world size, the backend
    and every process group's name and ranks (Note [A program belongs to its world] in
    graphex/distributed.py), so each rank has its own entry and none runs in another world;
  * the input signature: shapes (or, with dynamic=True, ranks and which dims are
    0/1), dtypes, devices, strides, and the values of non-tensor arguments.
What is only known after tracing is stored in the entry and re-checked on load:
  * the source of every file the trace went through (the method, the submodules'
    forwards, helpers), hashed whole, and that each such module is still loaded
    from that file; plus the globals those functions read, followed through
    modules and classes (`config.SCALE`, `cfg.Defaults.EPS`): plain values by
    value, functions and classes by qualified name (an `ACT = torch.relu` in
    a config file). Torch's and graphex's own files are covered by their versions
    (Note [Library files are found by path], below);
  * for each custom op in the graph: its schema, how it was registered, and the
    source of its fake/Meta function (C++: the source file it was registered from
    and the libraries loaded).
Weights are not part of any of it: new weights, same code, same entry.

Since cache_header/2 the list above is no longer what keeps an entry from going stale: each entry
carries Dynamo's own guards of its trace, checked on load and before every replay (guards.py,
Note [cache_compile keys on what the trace read]). The key above names the file (a cheap first
filter, and what `graphex cache ls` shows); the source hashes remain because Dynamo does not guard
source text.
"""

from __future__ import annotations

import dataclasses
import hashlib
import inspect
import json
import os
import sys
import types
from typing import Any

import torch

from .fingerprints import float_key
from .flat_call import SPELLED_OUT

_TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__))
_GRAPHEX_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_PRIMITIVES = (int, float, bool, str, type(None))


def digest(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=repr).encode()).hexdigest()


def versions() -> dict[str, Any]:
    import graphex
    from graphex import _C

    from .entry import FORMAT_VERSION
    from .guard_records import GUARD_FORMAT

    return {"graphex": graphex.__version__, "torch": torch.__version__, "python": sys.version,
            "spec_format": int(_C.SPEC_FORMAT_VERSION), "cache_format": FORMAT_VERSION, "guard_format": GUARD_FORMAT}


def function_identity(func: Any) -> dict[str, Any]:
    """Module, qualified name and the defining file's name (not its directory: a project moved elsewhere
    keeps its cache), and what the function closes over."""
    target = getattr(func, "__func__", func)
    try:
        file = os.path.basename(inspect.getsourcefile(target) or "")
    except TypeError:
        file = ""
    code = getattr(target, "__code__", None)
    cells = getattr(target, "__closure__", None) or ()
    closure = {name: describe_value(_cell_contents(cell))
               for name, cell in zip(getattr(code, "co_freevars", ()), cells)}
    return {"module": getattr(target, "__module__", "?"), "qualname": getattr(target, "__qualname__", repr(target)),
            "file": file, "closure": closure}


def _cell_contents(cell: Any) -> Any:
    try:
        return cell.cell_contents
    except ValueError:  # an empty cell
        return None


def project_root(func: Any) -> str:
    """Source paths under the directory of the cached function's file are recorded relative to it."""
    target = getattr(func, "__func__", func)
    try:
        return os.path.dirname(os.path.abspath(inspect.getsourcefile(target) or ""))
    except TypeError:
        return ""


def _relative(path: str, root: str) -> str:
    if root and os.path.commonpath([path, root]) == root:
        return os.path.relpath(path, root)
    return path


def _absolute(path: str, root: str) -> str:
    return path if os.path.isabs(path) else os.path.join(root, path)


def module_structure(module: torch.nn.Module) -> list[Any]:
    out: list[Any] = []
    for path, sub in module.named_modules(remove_duplicate=False):
        entry: dict[str, Any] = {"path": path, "type": f"{type(sub).__module__}.{type(sub).__qualname__}",
                                 "training": sub.training}
        entry["params"] = [[n, list(p.shape), str(p.dtype), str(p.device)] for n, p in sub._parameters.items()
                           if p is not None]
        entry["buffers"] = [[n, list(b.shape), str(b.dtype), str(b.device)] for n, b in sub._buffers.items()
                            if b is not None]
        entry["attrs"] = {k: _plain(v) for k, v in sorted(vars(sub).items())
                          if not k.startswith("_") and _plain(v) is not None}
        out.append(entry)
    return out


def describe_value(v: Any) -> Any:
    """What a global or closed-over value contributes to a key: plain values by value, functions and classes
    by qualified name, anything else by its type (its effect is then seen through the traced source)."""
    plain = _plain(v)
    if plain is not None:
        return plain
    if isinstance(v, (types.FunctionType, types.BuiltinFunctionType, types.MethodType, type)):
        target = getattr(v, "__func__", v)
        return ["callable", f"{getattr(target, '__module__', '?')}.{getattr(target, '__qualname__', '?')}"]
    if isinstance(v, types.ModuleType):
        return ["module", v.__name__]
    return ["object", f"{type(v).__module__}.{type(v).__qualname__}"]


def _float_text(x: float) -> str:
    """repr, which tells -0.0 from 0.0, and a NaN's bits, which repr drops (fingerprints.float_key)."""
    return repr(x) if x == x else float_key(x)


def _plain(v: Any) -> Any:
    """A JSON-able rendering of configuration-like values, or None for anything else."""
    if isinstance(v, _PRIMITIVES):
        return [type(v).__name__, v if not isinstance(v, float) else _float_text(v)]
    if isinstance(v, (tuple, list)) and all(isinstance(x, _PRIMITIVES) for x in v):
        return [type(v).__name__, [repr(x) for x in v]]
    if dataclasses.is_dataclass(v) and not isinstance(v, type):
        return [type(v).__qualname__, {f.name: repr(getattr(v, f.name)) for f in dataclasses.fields(v)}]
    if isinstance(v, torch.dtype):
        return ["dtype", str(v)]
    return None


def input_signature(flat_args: list[Any], dynamic: bool) -> list[Any]:
    sig: list[Any] = []
    for a in flat_args:
        if isinstance(a, torch.Tensor):
            if dynamic:
                shape = [s if s in (0, 1) else "n" for s in a.shape]
                strides = ["contiguous" if a.is_contiguous() else "strided"]
            else:
                shape, strides = list(a.shape), list(a.stride())
            sig.append(["tensor", str(a.dtype), str(a.device), shape, strides, a.requires_grad])
        elif isinstance(a, _PRIMITIVES):
            sig.append([type(a).__name__, a if not isinstance(a, float) else _float_text(a)])
        else:
            sig.append(["other", type(a).__qualname__])
    return sig


def describe_signature(flat_args: list[Any]) -> str:
    """The call's arguments for a message: tensors by dtype and shape, numbers and strings by value, any other object by
    its type only (its `__repr__` is user code, may raise, and on a transformers config serializes it: found by a
    helper, a raising `__repr__` made every miss fail)."""
    parts = []
    for a in flat_args:
        if isinstance(a, torch.Tensor):
            parts.append(f"{str(a.dtype).replace('torch.', '')}{list(a.shape)}")
        elif type(a) in _PRIMITIVES or type(a) in (torch.dtype, torch.device):
            parts.append(repr(a))
        else:
            parts.append(f"<{type(a).__qualname__} object>")
    return "(" + ", ".join(parts) + ")"


# -- after tracing: sources and custom ops -----------------------------------------------------

def _is_user_file(path: str) -> bool:
    """Note [Library files are found by path]
    torch's and graphex's own files are keyed by their versions, every other traced file
    by its content. "Inside" is decided on whole path components (os.path.commonpath), so
    a user folder `graphex_models/` next to the package or a library `torchfoo/` next to
    torch is the user's, not ours."""
    if path.startswith("<"):
        return False
    path = os.path.abspath(path)
    return not any(_inside(path, library) for library in (_TORCH_DIR, _GRAPHEX_DIR))


def _inside(path: str, directory: str) -> bool:
    try:
        return os.path.commonpath([path, directory]) == directory
    except ValueError:  # different drives
        return False


def file_hash(path: str) -> str | None:
    try:
        with open(path, "rb") as f:
            return hashlib.sha256(f.read()).hexdigest()
    except OSError:
        return None


def source_fingerprints(traced_code: list[types.CodeType], root: str) -> tuple[list[dict[str, Any]], str | None]:
    """([{file, sha256, globals}], problem): `problem` names code whose source cannot be checked."""
    files: dict[str, set[str]] = {}
    for code in traced_code:
        if code.co_filename.startswith("<frozen "):
            continue  # the interpreter's own modules (collections.abc, ...): keyed by the Python version (versions())
        if code.co_filename == SPELLED_OUT:
            continue  # Note [A call is spelled out]: a function of the call's spec, which is keyed
        if code.co_filename == "<string>" and code.co_qualname.startswith("__create_fn__.<locals>."):
            defined_in = _dataclass_module_file(code)  # Note [A dataclass method is its class's source]
            if defined_in is not None:
                if _is_user_file(defined_in):
                    files.setdefault(os.path.abspath(defined_in), set())
                continue
        if code.co_filename.startswith("<"):
            return [], f"{code.co_qualname} is defined in {code.co_filename}, whose source cannot be checked later"
        if _is_user_file(code.co_filename):
            files.setdefault(os.path.abspath(code.co_filename), set()).update(code.co_names)
    out = []
    for path, names in sorted(files.items()):
        h = file_hash(path)
        if h is None:
            return [], f"cannot read {path}"
        module = _module_for_file(path)
        out.append({"file": _relative(path, root), "sha256": h, "module": module.__name__ if module else None,
                    "globals": _read_globals(module, names)})
    return out, None


def _dataclass_module_file(code: types.CodeType) -> str | None:
    """Note [A dataclass method is its class's source]
    @dataclass writes `__init__`, `__eq__`, ... as source text and execs it (co_filename "<string>"), in the
    globals of the class's module. That text is a function of the class's fields, written in the module's file,
    and of the Python version (keyed in versions()). So such code is checked through the module's file: found
    from the function object that runs this code (its __module__). Cold path only (a cache write)."""
    import gc

    modules = {fn.__module__ for fn in gc.get_referrers(code)
               if isinstance(fn, types.FunctionType) and fn.__code__ is code}
    if len(modules) != 1:
        return None
    module = sys.modules.get(next(iter(modules)) or "")
    path = getattr(module, "__file__", None)
    return path if path and os.path.exists(path) else None


_NOT_FOUND = object()
_FOLLOW_DEPTH = 3  # config.SCALE, pkg.config.SCALE, pkg.config.Defaults.SCALE


def _read_globals(module: types.ModuleType | None, names: set[str]) -> dict[str, Any]:
    """The globals a file's traced code reads (`names`: its co_names), by dotted path: a module or class read
    through (`config.SCALE`) is followed into its attributes whose names the code also uses."""
    if module is None:
        return {}
    values: dict[str, Any] = {}

    def visit(namespace: dict[str, Any], prefix: str, depth: int) -> None:
        for name in sorted(names):
            value = namespace.get(name, _NOT_FOUND)
            if value is _NOT_FOUND or name.startswith("__"):
                continue
            path = prefix + name
            if isinstance(value, (types.ModuleType, type)):
                if depth < _FOLLOW_DEPTH and _is_user_object(value):
                    visit(vars(value), path + ".", depth + 1)
                if prefix:
                    values[path] = describe_value(value)
            else:
                values[path] = describe_value(value)

    visit(vars(module), "", 0)
    return values


def _is_user_object(value: Any) -> bool:
    """Modules and classes whose attributes can change without a new torch or graphex version."""
    if isinstance(value, types.ModuleType):
        f = getattr(value, "__file__", None)
        return bool(f) and _is_user_file(f)
    module = sys.modules.get(getattr(value, "__module__", "") or "")
    return module is not None and _is_user_object(module)


def _resolve(module: types.ModuleType, path: str) -> Any:
    value: Any = module
    for part in path.split("."):
        value = vars(value).get(part, _NOT_FOUND) if hasattr(value, "__dict__") else _NOT_FOUND
        if value is _NOT_FOUND:
            return _NOT_FOUND
    return value


def _module_for_file(path: str) -> types.ModuleType | None:
    for module in list(sys.modules.values()):
        f = getattr(module, "__file__", None)
        if f and os.path.abspath(f) == path:
            return module
    return None


# Note [A changed global is another state, not a stale entry]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# An entry records each traced file's hash and the module globals the trace read through it. A file changed on disk
# makes the entry stale for every process: it is removed when its replacement is written. A global that differs in
# this process (a function patched at run time, `modeling_llama.apply_rotary_pos_emb = mine`), or a module loaded from
# another file, says only that this process is not the one the entry was built in: another process, unpatched, still
# hits it. Removing it made two such processes replace each other's entry on every start (found by a helper); so the
# entry is a miss here and stays, and the new one is written beside it.
def check_sources(fingerprints: list[dict[str, Any]], root: str) -> str | None:
    """None when every traced file is unchanged on disk, else which one changed: the entry is stale in any process."""
    for fp in fingerprints:
        if file_hash(_absolute(fp["file"], root)) != fp["sha256"]:
            return f"{fp['file']} changed"
    return None


def check_source_state(fingerprints: list[dict[str, Any]], root: str) -> str | None:
    """None when this process loaded each traced file's module from that file and every global the trace read through
    it is as it was, else what differs (Note [A changed global is another state, not a stale entry])."""
    for fp in fingerprints:
        path = _absolute(fp["file"], root)
        module = sys.modules.get(fp.get("module") or "")
        loaded_from = getattr(module, "__file__", None)
        if loaded_from and os.path.abspath(loaded_from) != os.path.abspath(path):
            return f"module {fp['module']} is loaded from {loaded_from}, the entry was built from {path}"
        if fp["globals"] and module is None:
            return f"module {fp.get('module')} (which {fp['file']} defines) is not imported"
        changed = sorted(name for name, value in fp["globals"].items()
                         if (current := _resolve(module, name)) is _NOT_FOUND or describe_value(current) != value)
        if changed:
            return f"global {', '.join(changed)} read by {fp['file']} differs in this process"
    return None


def custom_op_fingerprints(ops: list[torch._ops.OpOverload]) -> list[dict[str, Any]]:
    from ..custom_ops.registration import describe

    out = []
    for op in sorted(set(ops), key=lambda o: o.name()):
        reg = describe(op)
        out.append({"op": op.name(), "schema": str(op._schema), "style": reg.style,
                    "fake": _fake_fingerprint(op, reg.style, reg.defined_at)})
    return out


def _fake_fingerprint(op: torch._ops.OpOverload, style: str, defined_at: str) -> str:
    from torch._library.custom_ops import OPDEFS

    if style == "custom_op":
        fn = getattr(OPDEFS.get(op._schema.name), "_abstract_fn", None)
        return _function_hash(fn)
    kernel = torch._library.simple_registry.singleton.find(op._schema.name).fake_impl.kernel
    if kernel is not None:
        return _function_hash(kernel)
    parts = []
    dump = torch._C._dispatch_dump(op.name())
    for line in dump.splitlines():
        if line.startswith("Meta:") and "registered at" in line:
            where = line.split("registered at", 1)[1].split("::", 1)[0].strip()
            parts.append(where + ":" + str(file_hash(where.rsplit(":", 1)[0])))
    if style == "cpp":
        src = defined_at.rsplit(":", 1)[0]
        parts.append(src + ":" + str(file_hash(src)))
        for lib in sorted(getattr(torch.ops, "loaded_libraries", set())):
            try:
                st = os.stat(lib)
                parts.append(f"{lib}:{st.st_size}:{st.st_mtime_ns}")
            except OSError:
                parts.append(f"{lib}:missing")
    return digest(parts)


def _function_hash(fn: Any) -> str:
    if fn is None:
        return "none"
    try:
        return hashlib.sha256(inspect.getsource(fn).encode()).hexdigest()
    except (OSError, TypeError):
        return f"unverifiable:{getattr(fn, '__qualname__', repr(fn))}"


def check_custom_ops(fingerprints: list[dict[str, Any]]) -> str | None:
    for fp in fingerprints:
        name, _, overload = fp["op"].partition(".")
        ns, _, opname = name.partition("::")
        try:
            packet = getattr(getattr(torch.ops, ns), opname)
            op = getattr(packet, overload or "default")
        except (AttributeError, RuntimeError):
            return f"custom op {fp['op']} is not registered in this process"
        current = custom_op_fingerprints([op])[0]
        if current != fp:
            what = "schema" if current["schema"] != fp["schema"] else "fake/Meta function"
            return f"the {what} of custom op {fp['op']} changed"
    return None
