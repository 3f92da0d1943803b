"""The files that use a generated op: repro.py (a minimal reproducer) and test_NAME.py (pytest).

Both build inputs of the schema's types from the sample values in typemap.py; arguments with
defaults keep their defaults. The reproducer has the template's three parts (imports,
`def infer_one_step()`, `if __name__ == "__main__"`) and its fixed names (compiled_model,
dummy_input, output).
"""

from __future__ import annotations

from .spec import Arg, OpSpec
from .text import WIDTH, camel, commented, indent, join, py_call, py_tuple
from ...custom_ops.typemap import TYPES

_GRAPHEX_IMPORT = 'import graphex  # noqa: F401  (registers backend="graphex")'


def repro(spec: OpSpec) -> str:
    inputs = _forward_params(spec)
    single = len(inputs) == 1
    star = "" if single else "*"
    call = py_call(spec.op, _call_args(spec), indent_by=15, labels=[a.name for a in spec.args if _passed(a)])
    if spec.returns:
        forward = [f"return {call[0]}", *call[1:]]
    else:
        returned = _first_mutated_input(spec)
        forward = [*call, f"return {returned.name}  # the op returns nothing: hand back what it wrote"]

    if single:
        dummy = [f"dummy_input = {TYPES[inputs[0].type].sample}"]
    else:
        dummy = ["dummy_input = (", *(f"    {TYPES[a.type].sample},  # {a.name}: {a.type}" for a in inputs), ")"]
    mutated = [a for a in inputs if a.mutable]
    eager = "dummy_input"
    if mutated:
        eager = "eager_input"
        copy_expr = "dummy_input.clone()" if single else "copy.deepcopy(dummy_input)"
        dummy += commented(f"eager_input = {copy_expr}", f"the op writes {_names(mutated)} in place: eager gets a copy",
                           room=WIDTH - 4)

    output_kind = _output_kind(spec)
    checks = [_equal("output", "expected", output_kind)]
    for arg in mutated:
        if not spec.returns and arg is _first_mutated_input(spec):
            continue  # it is the output
        at = "" if single else f"[{inputs.index(arg)}]"
        checks.append(_equal(f"dummy_input{at}", f"eager_input{at}", "seq" if arg.type == "Tensor[]" else "tensor"))
    shape = "{tuple(output.shape)} {output.dtype}" if output_kind == "tensor" else "{[tuple(t.shape) for t in output]}"
    written = f"; {_names(mutated)} written in place" if mutated else ""
    match = f"match = {' and '.join(checks)}"
    if len(match) > 96:
        match = "match = (\n        " + "\n        and ".join(checks) + "\n    )"

    return join(
        f'"""Minimal reproducer: {spec.op} under graphex, compared with eager (python repro.py)."""',
        "",
        ["import copy", ""] if mutated and not single else [],
        "import torch",
        "",
        _GRAPHEX_IMPORT,
        f"import {spec.module}  # noqa: F401  (registers {spec.op})",
        "",
        "",
        f"class {camel(spec.name)}Model(torch.nn.Module):",
        f"    def forward(self, {', '.join(a.name for a in inputs)}):",
        indent(forward, 8),
        "",
        "",
        "def infer_one_step():",
        '    """',
        f"    Run {spec.op} once under graphex and compare it with eager.",
        "",
        "    Key settings:",
        '    - backend="graphex" — capture the ATen graph once, replay it from C++ with no Python per op',
        "    - fullgraph=True — the forward is one graph: a graph break is an error, not a silent fallback",
        "    - dynamic=False — fixed shapes: a new input shape compiles a new graph",
        "    - torch.no_grad() — inference: no autograd state is recorded",
        '    """',
        f"    model = {camel(spec.name)}Model().eval()",
        '    compiled_model = torch.compile(model, backend="graphex", fullgraph=True, dynamic=False)',
        indent(dummy),
        "    with torch.no_grad():",
        f"        output = compiled_model({star}dummy_input)",
        f"        expected = model({star}{eager})",
        f"    {match}",
        f"    print(f\"{spec.qualname}: graphex {{'matches' if match else 'DIFFERS FROM'}} eager \"",
        f'          f"(output {shape}{written})")',
        "    if not match:",
        "        raise SystemExit(1)",
        "",
        "",
        'if __name__ == "__main__":',
        "    infer_one_step()",
    )


def test_file(spec: OpSpec) -> str:
    positional = [a for a in spec.args if not a.kwarg_only]
    while positional and not _passed(positional[-1]):
        positional.pop()  # defaults in between get sample values: they are passed by position
    keywords = [a for a in spec.args if a.kwarg_only and _passed(a)]
    made = py_tuple([TYPES[a.type].sample for a in positional], indent_by=11, labels=[a.name for a in positional])
    if keywords:
        made[-1] += ", {" + ", ".join(f'"{a.name}": {TYPES[a.type].sample}' for a in keywords) + "}"
    # With keyword-only arguments make_args() returns (args, kwargs); otherwise just args.
    kw = ", **kwargs" if keywords else ""

    mutated = [a for a in spec.args if a.mutable and (a in positional or a in keywords)]
    eager = "eager_" if mutated else ""
    call_compiled = "compiled(*args, **kwargs)" if keywords else "compiled(*args)"
    call_eager = f"call_op(*{eager}args, **{eager}kwargs)" if keywords else f"call_op(*{eager}args)"
    run = [f"output = {call_compiled}", f"expected = {call_eager}"] if spec.returns else [call_compiled, call_eager]
    checks = _assert_equal("output", "expected", _output_kind(spec)) if spec.returns else []
    for arg in mutated:
        at = f"args[{positional.index(arg)}]" if arg in positional else f'kwargs["{arg.name}"]'
        checks += _assert_equal(at, f"eager_{at}", "seq" if arg.type == "Tensor[]" else "tensor",
                                f'"{arg.name}, written in place, differs from eager"')
    copied = "eager_args, eager_kwargs = copy.deepcopy((args, kwargs))" if keywords else \
        "eager_args = copy.deepcopy(args)"
    copy_line = commented(copied, f"the op writes {_names(mutated)} in place", room=WIDTH - 8)

    return join(
        f'"""graphex vs eager for {spec.op}, and torch.library.opcheck: python -m pytest test_{spec.name}.py"""',
        "",
        ["import copy", ""] if mutated else [],
        "import torch",
        "",
        _GRAPHEX_IMPORT,
        f"import {spec.module}  # noqa: F401  (registers {spec.op})",
        "",
        "",
        "def make_args():",
        f'    """Fresh arguments for {spec.op}."""',
        f"    return {made[0]}",
        indent(made[1:]),
        "",
        "",
        f"def call_op(*args{kw}):",
        f"    return {spec.op}(*args{kw})",
        "",
        "",
        "def test_graphex_matches_eager():",
        '    compiled = torch.compile(call_op, backend="graphex", fullgraph=True, dynamic=False)',
        "    for _ in range(2):  # the first call captures the graph, the second replays it",
        f"        {'args, kwargs' if keywords else 'args'} = make_args()",
        indent(copy_line, 8) if mutated else [],
        "        with torch.no_grad():",
        indent(run, 12),
        indent(checks, 8),
        "",
        "",
        "def test_opcheck():",
        indent(_opcheck(spec, positional + keywords, "*make_args()" if keywords else "make_args()")),
    )


def _opcheck(spec: OpSpec, passed: list[Arg], args: str) -> list[str]:
    lines = ["# Checks the schema, the fake function against the kernel, and functionalization: what",
             "# torch.compile relies on."]
    if not (spec.inplace and any(a.type.startswith("Device") for a in passed)):
        return [*lines, f"torch.library.opcheck({spec.op}.default, {args})"]
    return [
        "# Checks the fake function against the kernel, and functionalization: what torch.compile",
        "# relies on. Not the schema: test_schema cannot inspect the Device argument of an op that",
        "# writes its inputs (a torch limitation).",
        f"torch.library.opcheck({spec.op}.default, {args},",
        '                      test_utils=("test_autograd_registration", "test_faketensor",',
        '                                  "test_aot_dispatch_dynamic"))',
    ]


def _passed(arg: Arg) -> bool:
    """Arguments with a default keep it, unless the op writes to them."""
    return not arg.has_default or arg.mutable


def _forward_params(spec: OpSpec) -> list[Arg]:
    """The reproducer's forward() takes the tensor arguments it passes to the op."""
    return [a for a in spec.args if a.is_tensor and _passed(a)]


def _call_args(spec: OpSpec) -> list[str]:
    """By position, as the schema orders them; by keyword after `*` or a skipped default.

    (Not by keyword where position will do: torch's dispatch to Python modes takes a
    keyword argument named `mode` for its own.)
    """
    args, by_keyword = [], False
    for arg in spec.args:
        if not _passed(arg):
            by_keyword = True
            continue
        by_keyword = by_keyword or arg.kwarg_only
        value = arg.name if arg.is_tensor else TYPES[arg.type].sample
        args.append(f"{arg.name}={value}" if by_keyword else value)
    return args


def _first_mutated_input(spec: OpSpec) -> Arg:
    return next(a for a in _forward_params(spec) if a.mutable)


def _output_kind(spec: OpSpec) -> str:
    if spec.returns:
        return "tensor" if spec.returns == ("Tensor",) else "seq"
    return "seq" if _first_mutated_input(spec).type == "Tensor[]" else "tensor"


def _equal(a: str, b: str, kind: str) -> str:
    return f"torch.equal({a}, {b})" if kind == "tensor" else f"all(map(torch.equal, {a}, {b}))"


def _assert_equal(a: str, b: str, kind: str, message: str = "") -> list[str]:
    suffix = f", {message}" if message else ""
    if kind == "tensor":
        return [f"assert torch.equal({a}, {b}){suffix}"]
    return [f"for got, want in zip({a}, {b}, strict=True):", f"    assert torch.equal(got, want){suffix}"]


def _names(args: list[Arg]) -> str:
    return ", ".join(a.name for a in args)
