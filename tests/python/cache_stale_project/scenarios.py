"""The staleness scenarios of test_cache_stale.py, run in one fresh process; prints a JSON report.

Library folders are simulated under lib/: keys' torch and graphex directories are pointed at
lib/torch and lib/graphex, so lib/torchfoo and lib/graphex_models sit beside them.
"""
import json
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))

import graphex  # noqa: E402
from graphex.inference import keys  # noqa: E402

keys._GRAPHEX_DIR = os.path.join(HERE, "lib", "graphex")
keys._TORCH_DIR = os.path.join(HERE, "lib", "torch")

import importlib.util  # noqa: E402

import config  # noqa: E402
import ops  # noqa: E402,F401
from config import ACT  # noqa: E402


def _load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


graphex_models_helper = _load("graphex_models_helper", os.path.join(HERE, "lib", "graphex_models", "helper.py"))
torchfoo_helper = _load("torchfoo_helper", os.path.join(HERE, "lib", "torchfoo", "helper.py"))


def module_attr(x):
    return x * config.SCALE


def global_function(x):
    return ACT(x) * 2


def beside_graphex(x):
    return graphex_models_helper.helper(x) + 1


def beside_torch(x):
    return torchfoo_helper.helper(x) - 1


def library_meta(x):
    return torch.ops.cachestale.twice(x) + 1


def make_scaled(scale):
    def scaled(x):
        return x * scale

    return scaled


def unchanged(x):
    return x.cos() + 1


def dynamic(x, y):
    return (x @ y).relu() * x.shape[0]


def dynamic_branch(x):
    if x.shape[0] > 4:
        return x.relu()
    return x.sigmoid()


def main(model):
    scale = float(open(os.path.join(HERE, "closure.txt")).read())
    report = {}
    x = torch.randn(3, 4)
    cases = [("script", model.cached_forward, model._forward)]
    for f in (module_attr, global_function, beside_graphex, beside_torch, library_meta, make_scaled(scale),
              unchanged):
        cases.append((f.__name__, graphex.inference.cache_compile(f), f))
    with torch.no_grad():
        for name, cached, eager in cases:
            out = cached(x)
            report[name] = dict(cached.stats, equal=bool(torch.equal(out, eager(x))))
        for name, f, sizes in (("dynamic", dynamic, (3, 5, 7, 9)), ("dynamic_branch", dynamic_branch, (5, 3, 8, 2))):
            cached, equal = graphex.inference.cache_compile(f, dynamic=True), True
            for n in sizes:
                args = (torch.randn(n, 4), torch.randn(4, n))[: f.__code__.co_argcount]
                equal &= bool(torch.equal(cached(*args), f(*args)))
            report[name] = dict(cached.stats, equal=equal)
    print(json.dumps(report))
