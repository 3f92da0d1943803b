"""`graphex new` on a terminal: the custom-op guide's questions, asked in its order.

    1. what state is the op in?   not written -> generate files
                                  works in eager, not in a graph -> `graphex check` + Meta skeleton
                                  in the graph but misbehaving -> `graphex triage`
    2. how is it registered (custom_op / library / cpp)?
    3. in-place or not?
    4. namespace::name
    5. signature (Enter for the default)

Answers are read with input(), so tests drive this by patching builtins.input.
"""

from __future__ import annotations

from dataclasses import dataclass

from .plan import STYLES
from .spec import SkeletonError, default_signature, parse_op

STATES = {
    "1": "not written yet: generate the registration, a reproducer and a test",
    "2": "works in eager, fails or breaks the graph under torch.compile",
    "3": "in the graph, but wrong results, recompiles, copies or slow",
}

_NOT_SURE = ("How to tell: @torch.library.custom_op on a Python function -> custom_op; "
             'torch.library.Library("ns", "FRAGMENT") with define() and @impl(...) -> library; '
             "TORCH_LIBRARY(ns, m) in C++ -> cpp.")


@dataclass(frozen=True)
class Answers:
    state: str                  # "1", "2" or "3"
    style: str | None = None
    qualname: str | None = None
    signature: str | None = None
    inplace: bool = False


def ask() -> Answers:
    """Ask until every answer is valid; EOFError/KeyboardInterrupt propagate (the caller exits)."""
    state = _choose("What state is your op in?", STATES)
    if state == "3":
        return Answers(state)
    styles = {str(i): f"{name} — {about}" for i, (name, about) in enumerate(STYLES.items(), 1)}
    if state == "2":
        styles[str(len(styles) + 1)] = "not sure"
    while True:
        choice = _choose("How is the op registered?", styles)
        if styles[choice] != "not sure":
            break
        print(_NOT_SURE)
    style = list(STYLES)[int(choice) - 1]
    inplace = _yes_no("Does it write any of its inputs in place (like a KV-cache update)?")
    while True:
        qualname = input("Op name as namespace::name (e.g. mylib::my_op): ").strip()
        try:
            parse_op(qualname, inplace=inplace)
            break
        except SkeletonError as e:
            print(e)
    name = qualname.split("::")[1]
    while True:
        default = default_signature(name, inplace)
        signature = input(f"Signature [{default}]: ").strip() or None
        try:
            parse_op(qualname, signature, inplace=inplace)
            return Answers(state, style, qualname, signature, inplace)
        except SkeletonError as e:
            print(e)


def _choose(question: str, options: dict[str, str]) -> str:
    print(question)
    for key, text in options.items():
        print(f"  {key}) {text}")
    while True:
        answer = input(f"[{'/'.join(options)}]: ").strip()
        if answer in options:
            return answer
        print(f"Please answer {', '.join(options)}.")


def _yes_no(question: str) -> bool:
    while True:
        answer = input(f"{question} [y/N]: ").strip().lower()
        if answer in ("", "n", "no"):
            return False
        if answer in ("y", "yes"):
            return True
        print("Please answer y or n.")
