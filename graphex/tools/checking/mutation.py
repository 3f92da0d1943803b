"""Checks 3 and 4: the kernel writes exactly what the schema declares; no output aliases an input.

Why it matters in graph mode: functionalization trusts the schema. A write it
does not know about is lost or reordered (the graph may reuse or skip the
input), a declared write that never happens costs copies, and an output that
shares memory with an input breaks the rule that graph outputs are fresh
(since PyTorch 2.6, an in-place op must return nothing for what it mutates).
"""

from __future__ import annotations

import torch

from graphex.custom_ops import fixes
from graphex.custom_ops.registration import Registration

from .record import Call
from .report import Problem


def declared_writes(schema: torch._C.FunctionSchema) -> list[str]:
    return [a.name for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write]


def check_writes(call: Call, reg: Registration) -> list[Problem]:
    """Check 3 on one call: every input the kernel wrote is declared."""
    declared = declared_writes(call.op._schema)
    undeclared = [n for n in call.written if n not in declared]
    if not undeclared:
        return []
    return [Problem(call.op.name(), "mutations_declared", call.case_id,
                    f"writes only to declared inputs ({_declared_text(reg, declared)})",
                    "the kernel wrote " + ", ".join(f"{n} ({call.written[n]})" for n in undeclared),
                    fixes.declare_mutation(reg, undeclared))]


def check_declared_written(calls: list[Call], reg: Registration) -> list[Problem]:
    """Check 3 across the op's calls: every declared write happens on at least one of them."""
    declared = declared_writes(calls[0].op._schema)
    never = [n for n in declared if all(n not in c.written for c in calls)]
    if not never:
        return []
    return [Problem(calls[0].op.name(), "mutations_declared", calls[0].case_id,
                    f"the kernel writes {', '.join(never)}, declared mutable ({_declared_text(reg, declared)})",
                    f"{', '.join(never)} never written on the {len(calls)} recorded call(s) "
                    "(values unchanged, no in-place op on it)",
                    fixes.undeclare_mutation(reg, never))]


def check_aliases(call: Call, reg: Registration) -> list[Problem]:
    """Check 4 on one call: outputs share no memory with inputs; a mutated input is not returned."""
    schema = call.op._schema
    declared = declared_writes(schema)
    problems = []
    for i, ret in enumerate(schema.returns):
        if ret.alias_info is not None and ret.alias_info.is_write:
            problems.append(Problem(call.op.name(), "no_output_alias", call.case_id,
                                    "an in-place op returns nothing for the inputs it mutates",
                                    f"the schema returns output {i} as a mutated input: {schema}",
                                    fixes.no_mutated_return(reg, sorted(set(declared) | set(call.written)))))
            return problems
    for i, name, same in call.aliases:
        base = name.split("[")[0]
        what = name if same else f"a view of {name}"
        if base in declared or base in call.written:
            fix = fixes.no_mutated_return(reg, sorted(set(declared) | set(call.written) | {base}))
            seen = f"output {i} is {what}, which the kernel mutates"
        else:
            fix = fixes.return_clone(reg, i, name)
            seen = f"output {i} is {what} (same storage)"
        problems.append(Problem(call.op.name(), "no_output_alias", call.case_id,
                                "outputs in new memory, never an input or a view of one", seen, fix))
        break
    return problems


def _declared_text(reg: Registration, declared: list[str]) -> str:
    if reg.style == "custom_op":
        return f"mutates_args={tuple(declared)!r}"
    return f"(a!) in the schema: {', '.join(declared) or 'none'}"
