"""Triage sees what a script compiles and the calls of it without replacing anything
(Note [Triage observes torch.compile through Python's profiling hook], graphex/tools/triaging/observe.py).

Each case is a small script run by `runner.run_script` in this process: every spelling of torch.compile a
user writes, calls told apart when compiled objects share code, the first call's inputs saved before the
call mutates them, and the script's error laid to the call it came out of."""

from __future__ import annotations

import sys
import textwrap

import pytest
import torch

import graphex  # noqa: F401  (registers the backend)
from graphex.tools.triaging import runner


def _run(tmp_path, body: str, entry: str | None = None) -> runner.ScriptRun:
    script = tmp_path / "script.py"
    script.write_text("import torch\nimport graphex\n" + textwrap.dedent(body))
    torch._dynamo.reset()
    ran = runner.run_script(str(script), [], entry)
    assert ran.observer_errors == []
    return ran


def _calls(ran: runner.ScriptRun) -> list[tuple[str, int]]:
    return [(c.name, c.calls) for c in ran.compiled]


def test_every_spelling_of_compile_is_seen_with_its_options(tmp_path):
    ran = _run(tmp_path, """
        class M(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.lin = torch.nn.Linear(4, 4)
            def forward(self, x):
                return self.lin(x).relu()

        def f(x):
            return x.sin() + 1

        @torch.compile(backend="graphex", fullgraph=True)
        def decorated(x):
            return x.cos()

        m = torch.compile(M(), backend="graphex", fullgraph=True, dynamic=False, options={"cse": False})
        g = torch.compiler.compile(f, backend="graphex", dynamic=False)
        inplace = M()
        inplace.compile(backend="graphex")
        x = torch.randn(2, 4)
        with torch.no_grad():
            for _ in range(3):
                m(x); g(x); inplace(x)
            decorated(x)
    """)
    assert _calls(ran) == [("decorated", 1), ("M", 3), ("f", 3), ("M", 3)]
    source = (tmp_path / "script.py").read_text().splitlines()

    def line(snippet: str) -> int:
        return next(i for i, text in enumerate(source, 1) if snippet in text)

    sites = [int(c.compiled_at.split(":")[1].split()[0]) for c in ran.compiled]
    assert sites[1:] == [line("m = torch.compile("), line("g = torch.compiler.compile("), line("inplace.compile(")]
    assert sites[0] in (line("@torch.compile("), line("def decorated"))
    m = ran.compiled[1]
    assert m.backend == "graphex" and m.options == {"cse": False} and m.fullgraph and m.dynamic is False
    assert ran.compiled[2].fullgraph is False and ran.compiled[0].fullgraph is True
    assert ran.compiled[3].module() is not None  # Module.compile() compiles the bound _call_impl
    for c in ran.compiled:
        assert "script.py:" in c.first_call_at and c.first_args is not None


def test_functions_compiled_from_one_code_object_are_told_apart(tmp_path):
    ran = _run(tmp_path, """
        def make(k):
            def step(x):
                return x * k
            return step

        a = torch.compile(make(2.0), backend="graphex")
        b = torch.compile(make(3.0), backend="graphex")
        x = torch.ones(3)
        a(x); a(x); b(x * 5)
    """)
    assert _calls(ran) == [("make.<locals>.step", 2), ("make.<locals>.step", 1)]
    assert torch.equal(ran.compiled[1].first_args[0], torch.full((3,), 5.0))


def test_first_inputs_are_saved_before_the_call_mutates_them(tmp_path):
    ran = _run(tmp_path, """
        def bump(x):
            x.add_(1)
            return x * 2

        f = torch.compile(bump, backend="graphex", fullgraph=True)
        x = torch.zeros(3)
        f(x); f(x)
        assert torch.equal(x, torch.full((3,), 2.0))
    """)
    (c,) = ran.compiled
    assert c.calls == 2 and torch.equal(c.first_args[0], torch.zeros(3))


def test_keyword_and_default_arguments_are_the_call_as_made(tmp_path):
    ran = _run(tmp_path, """
        class M(torch.nn.Module):
            def forward(self, x, *, scale=1.0, bias=None):
                return x * scale if bias is None else x * scale + bias

        m = torch.compile(M(), backend="graphex")
        m(torch.ones(2), scale=2.0, bias=torch.zeros(2))
    """)
    (c,) = ran.compiled
    assert len(c.first_args) == 1 and sorted(c.first_kwargs) == ["bias", "scale"] and c.first_kwargs["scale"] == 2.0


def test_the_error_is_laid_to_the_call_it_came_out_of(tmp_path):
    ran = _run(tmp_path, """
        def ok(x):
            return x + 1

        def bad(x):
            if x.sum() > 10:
                raise ValueError("too big")
            return x

        none = torch.compile(lambda x: None, backend="graphex")
        f = torch.compile(ok, backend="graphex")
        g = torch.compile(bad, backend="eager")
        x = torch.ones(4)
        none(x); f(x); g(x)
        none(x)
        g(x * 100)
    """)
    assert isinstance(ran.error, ValueError)
    culprit = ran.failed_in
    assert culprit is ran.compiled[2] and culprit.error is ran.error
    assert culprit.error_call == 2 and culprit.error_call_at.endswith("script.py:18 in <module>: g(x * 100)")
    assert ran.compiled[0].error is None  # returned None: not an error


def test_an_error_outside_compiled_calls_is_laid_to_none(tmp_path):
    ran = _run(tmp_path, """
        f = torch.compile(lambda x: x + 1, backend="graphex")
        f(torch.ones(2))
        raise RuntimeError("the script's own")
    """)
    assert isinstance(ran.error, RuntimeError) and ran.failed_in is None


def test_nothing_of_torch_is_replaced_and_a_profiler_the_script_set_keeps_running(tmp_path):
    real_compile = torch.compile
    ran = _run(tmp_path, """
        import sys
        seen = []
        assert torch.compile.__module__ == "torch" and torch.compile.__name__ == "compile"
        def mine(frame, event, arg):
            if event == "call" and frame.f_code.co_name == "target":
                seen.append(frame.f_code.co_name)
        previous = sys.getprofile()
        def target(x):
            return x * 2
        f = torch.compile(target, backend="graphex")
        f(torch.ones(2))
        assert previous is not None  # triage's observer
    """)
    assert torch.compile is real_compile and sys.getprofile() is None
    assert _calls(ran) == [("target", 1)]


def test_a_profile_function_set_before_triage_is_called_and_restored(tmp_path):
    events: list[str] = []

    def outer(frame, event, arg):
        if event == "call" and frame.f_code.co_name == "marked_fn":
            events.append("seen")

    sys.setprofile(outer)
    try:
        ran = _run(tmp_path, """
            def marked_fn(x):
                return x - 1
            marked_fn(torch.ones(1))
            f = torch.compile(lambda x: x + 1, backend="graphex")
            f(torch.ones(1))
        """)
        restored = sys.getprofile()
    finally:
        sys.setprofile(None)
    assert restored is outer and events == ["seen"] and _calls(ran) == [("<lambda>", 1)]


@pytest.mark.parametrize("entry", [None, "main"])
def test_entry_returning_a_model_is_compiled_and_called_once(tmp_path, entry):
    body = """
        def main():
            return torch.nn.Linear(3, 3), (torch.ones(1, 3),)
    """ + ("" if entry else "\nmain()\n")
    ran = _run(tmp_path, body, entry)
    assert _calls(ran) == ([("Linear", 1)] if entry else [])
