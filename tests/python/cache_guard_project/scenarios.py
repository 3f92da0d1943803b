"""State a trace reads that no source edit shows, in two variants ("a", "b"); for test_cache_guards.py.

    python scenarios.py CACHE_DIR VARIANT   prints {scenario: {equal, hits, misses, compiles, writes}} as JSON

Each scenario builds its model with the variant's value, calls it through cache_compile and compares with
eager. A process of variant "b" after one of "a" must miss (the entry was traced with "a"'s value) and
match eager; a second process of "a" must hit.
"""
import contextvars
import json
import sys
import types

import torch
from torch import nn

import graphex
import helpers_a
from graphex import compat
import helpers_b

CACHE, VARIANT = sys.argv[1], sys.argv[2]
A = VARIANT == "a"


def cached(model, name):
    model.cached = graphex.inference.cache_compile(model._forward, cache_dir=f"{CACHE}/{name}")
    return model


class Namespace(nn.Module):  # an attribute of a config object that is not a dataclass
    def __init__(self):
        super().__init__()
        self.cfg = types.SimpleNamespace(mult=2.0 if A else 3.0, act="relu" if A else "tanh")

    def _forward(self, x):
        y = x * self.cfg.mult
        return y.relu() if self.cfg.act == "relu" else y.tanh()


class DictAttr(nn.Module):  # values in a dict attribute
    def __init__(self):
        super().__init__()
        self.table = {"scale": 2.0 if A else 0.5, "shift": 1}

    def _forward(self, x):
        return x * self.table["scale"] + self.table["shift"]


class StoredFunction(nn.Module):  # a function stored on the module
    def __init__(self):
        super().__init__()
        self.act = torch.sigmoid if A else torch.tanh

    def _forward(self, x):
        return self.act(x) + 1


class ReplacedMethod(nn.Module):  # a method replaced on the class from another module
    def _forward(self, x):
        return self.helper(x) + 1


ReplacedMethod.helper = helpers_a.helper if A else helpers_b.helper


class NewShapeAfterChange(nn.Module):  # a plain attribute changed in-process before a new shape compiles
    def __init__(self):
        super().__init__()
        self.scale = 2.0

    def _forward(self, x):
        return x * self.scale


_UNSET = object()  # a sentinel default, as torch's own config module keeps (torch 2.15: _UNSET_SENTINEL)
MODE = contextvars.ContextVar("graphex_scenario_mode", default=_UNSET)
if not A:
    MODE.set(3.0)


class ContextVarRead(nn.Module):  # a ContextVar's value (Dynamo traces ContextVar.get() since torch 2.15)
    def _forward(self, x):
        v = MODE.get()
        return x.relu() if v is _UNSET else x * v


def transformers_attention():
    """config._attn_implementation ("eager" vs "sdpa"): read through transformers' config object."""
    import transformers

    transformers.logging.set_verbosity_error()
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    cfg._attn_implementation = "eager" if A else "sdpa"
    model = transformers.LlamaForCausalLM(cfg).eval()

    class Step(nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def _forward(self, ids, mask):
            return self.model(input_ids=ids, attention_mask=mask, use_cache=False).logits

    return Step()


def run(model, *inputs):
    with torch.no_grad():
        out = model.cached(*inputs)
        again = model.cached(*inputs)
        ref = model._forward(*inputs)
    return {"equal": bool(torch.equal(out, ref) and torch.equal(again, ref)), **model.cached.stats}


def main():
    torch.manual_seed(0)
    x = torch.randn(3, 5)
    report = {}
    for cls in (Namespace, DictAttr, StoredFunction, ReplacedMethod):
        report[cls.__name__] = run(cached(cls(), cls.__name__), x)
    m = cached(NewShapeAfterChange(), "NewShapeAfterChange")
    if A:  # process "a": compile batch 3 with scale 2.0, then change scale and compile batch 4 in-process
        run(m, x)
        m.scale = 3.0
    report["NewShapeAfterChange"] = run(m, torch.randn(4, 5))
    if compat.TORCH_VERSION >= (2, 15):
        report["ContextVarRead"] = run(cached(ContextVarRead(), "ContextVarRead"), x)
    ids = torch.tensor([[1, 5, 9, 2, 7, 3]])
    mask = torch.tensor([[0, 1, 1, 1, 1, 1]])  # a padded token: eager and sdpa attention differ
    report["transformers"] = run(cached(transformers_attention(), "transformers"), ids, mask)
    print(json.dumps(report))


if __name__ == "__main__":
    main()
