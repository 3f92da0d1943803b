"""A transformers config's attribute read as object's own lookup (Note [A transformers config's attribute is read as
object's], graphex/inference/lookups.py): the config guards a cache_compile call no longer checks one by one, and each
change that breaks the proof (the config, its class, the lookup functions, what they read) is seen by the next call."""

import pytest
import torch
import torch.nn as nn
import transformers  # installed by make test (bench/requirements.txt): these are transformers' configs
from transformers import configuration_utils

import graphex
from graphex import compat
from graphex.inference import lookups

PreTrainedConfig = configuration_utils.PreTrainedConfig

STATE = {"bump": False}


class ReadsConfig(nn.Module):
    """Reads a config the way transformers' models do: a mapped name, a plain one, a hasattr that is False."""

    def __init__(self):
        super().__init__()
        self.config = transformers.GPT2Config(n_layer=2, n_head=4, n_embd=16, vocab_size=8)
        self.proj = nn.Linear(4, 4)

    def forward(self, x):
        y = self.proj(x) * self.config.num_hidden_layers
        if self.config.output_hidden_states:
            y = y + 1
        if hasattr(self.config, "vision_feature_layer"):
            y = y - 1
        if hasattr(self.config, "output_attentions") and self.config.output_attentions:  # a property: a plain read
            y = y * 2
        return y


def expected(model, x):
    y = model.proj(x) * model.config.num_hidden_layers + (1 if model.config.output_hidden_states else 0)
    return y * 2 if model.config.output_attentions else y


def test_the_installed_transformers_configs_are_recognized():
    # If this fails, transformers changed its configs' __getattribute__: read the new code, and if it still does what
    # the Note says, update the copies in graphex/inference/lookups.py.
    gpt2, llama = transformers.GPT2Config(), transformers.LlamaConfig()
    assert lookups.config_name(gpt2, "num_hidden_layers") == "n_layer"
    assert lookups.config_name(gpt2, "return_dict") == "return_dict"
    assert lookups.config_name(llama, "num_hidden_layers") == "num_hidden_layers"
    assert lookups.config_name(llama, "attribute_map") == "attribute_map"


def test_what_is_not_read_as_objects_is_not_proven():
    class OwnLookup(transformers.GPT2Config):
        def __getattribute__(self, key):
            return super().__getattribute__(key)

    assert lookups.config_name(OwnLookup(), "n_layer") is None  # a third __getattribute__
    spec = transformers.GPT2Config()
    spec.__dict__["_heterogeneity_spec"] = None  # per-layer attributes raise or log: not object's
    assert lookups.config_name(spec, "n_layer") is None
    own_map = transformers.GPT2Config()
    own_map.__dict__["attribute_map"] = {}
    assert lookups.config_name(own_map, "n_layer") is None
    assert lookups.config_name(object(), "x") is None
    saved = configuration_utils.__dict__.get("super", None)
    configuration_utils.super = super  # `super` shadowed in the module: whatever it holds, not proven
    try:
        assert lookups.config_name(transformers.GPT2Config(), "n_layer") is None
    finally:
        del configuration_utils.super
        assert saved is None


def _fast_entry(tmp_path):
    model = ReadsConfig().eval()
    fn = graphex.inference.cache_compile(model.forward, cache_dir=tmp_path)
    x = torch.randn(2, 4)
    with torch.no_grad():
        for _ in range(3):
            assert torch.equal(fn(x), expected(model, x))
    (entry,) = [e for entries in fn._by_call.values() for e in entries]
    return model, fn, x, entry.guard_set


def test_a_configs_guards_are_proven_by_the_watch(tmp_path):
    _, fn, _, guards = _fast_entry(tmp_path)
    assert fn._fast is not None
    every_call = guards.source[guards.source.index("def run"):guards.source.index("def slow")]
    if compat.TORCH_VERSION < (2, 12):
        # Dynamo 2.11 inlines the config's lookup and guards what it reads, past it (`object.__getattribute__(config,
        # '__dict__')`, the attribute_map's keys): another form of guard, which this proof does not cover; they stay
        # in the every-call checks there, as before
        assert "object.__getattribute__(" in every_call, every_call
        return
    for name in ("num_hidden_layers", "output_hidden_states", "vision_feature_layer", "output_attentions"):
        assert name not in every_call, f"the config's {name} is still checked on every call:\n{every_call}"
    full = guards.source[:guards.source.index("def run")]
    premises = [h for h in guards.run.__globals__["H"] if isinstance(h, lookups.Premise)]
    assert premises and all(f"H[{guards.run.__globals__['H'].index(p)}](" in full for p in premises)


def test_a_change_to_the_config_is_seen(tmp_path):
    model, fn, x, _ = _fast_entry(tmp_path)
    with torch.no_grad():
        model.config.n_layer = 3  # through the attribute_map's other name
        assert torch.equal(fn(x), expected(model, x))
        model.config.num_hidden_layers = 5
        assert torch.equal(fn(x), expected(model, x))
        model.config.output_hidden_states = True
        assert torch.equal(fn(x), expected(model, x))
        for _ in range(2):
            assert torch.equal(fn(x), expected(model, x))


def test_a_changed_attribute_map_is_seen(tmp_path):
    model, fn, x, _ = _fast_entry(tmp_path)
    cls = type(model.config)
    saved = dict(cls.attribute_map)
    try:
        with torch.no_grad():
            cls.attribute_map["num_hidden_layers"] = "n_head"  # the same dict, another meaning: 4
            for _ in range(2):
                assert torch.equal(fn(x), expected(model, x))
    finally:
        cls.attribute_map.clear()
        cls.attribute_map.update(saved)


def test_a_lookup_replaced_with_one_that_changes_later_is_seen(tmp_path):
    """The proof's premise broken by a change the watch sees, while every guarded value stays the same at that moment:
    the full check that follows must not publish a watch the fast path would then trust (the premise line)."""
    model, fn, x, _ = _fast_entry(tmp_path)
    original = PreTrainedConfig.__dict__["__getattribute__"]

    def drifting(self, key):
        value = original(self, key)
        return value + 1 if key in ("num_hidden_layers", "n_layer") and STATE["bump"] else value

    PreTrainedConfig.__getattribute__ = drifting
    try:
        with torch.no_grad():
            assert torch.equal(fn(x), expected(model, x))  # same values: the guards alone would pass
            assert torch.equal(fn(x), expected(model, x))
            STATE["bump"] = True  # no dict graphex watches changes
            for _ in range(2):
                assert torch.equal(fn(x), expected(model, x)), "a lookup that changed was replayed from the watch"
    finally:
        PreTrainedConfig.__getattribute__ = original
        STATE["bump"] = False


def test_a_heterogeneity_spec_set_later_is_seen(tmp_path):
    model, fn, x, _ = _fast_entry(tmp_path)
    with torch.no_grad():
        model.config.__dict__["_heterogeneity_spec"] = None  # the instance dict, watched: the premise fails
        assert torch.equal(fn(x), expected(model, x))
        del model.config.__dict__["_heterogeneity_spec"]
        assert torch.equal(fn(x), expected(model, x))


def test_a_change_to_a_property_or_its_getter_is_seen(tmp_path):
    """Note [A property that returns an attribute holds]: the value behind it, its getter's code, the property."""
    model, fn, x, _ = _fast_entry(tmp_path)
    getter = PreTrainedConfig.__dict__["output_attentions"].fget
    code = getter.__code__

    def negated(self):
        return not self._output_attentions

    try:
        with torch.no_grad():
            model.config._attn_implementation = "eager"  # output_attentions needs it
            assert torch.equal(fn(x), expected(model, x))
            model.config.output_attentions = True  # its setter writes _output_attentions
            assert torch.equal(fn(x), expected(model, x))
            assert torch.equal(fn(x), expected(model, x))
            getter.__code__ = negated.__code__  # the same property, another getter
            for _ in range(2):
                assert torch.equal(fn(x), expected(model, x))
    finally:
        getter.__code__ = code


def test_a_property_whose_getter_is_not_a_plain_read_stays_checked():
    from graphex.inference.pins import _Pins

    class Holder:
        def __init__(self):
            self._x = 1

        @property
        def plain(self):
            """A docstring changes no code."""
            return self._x

        @property
        def computed(self):
            return self._x + 1

        @property
        def other(self):
            return self.missing

    pins = _Pins()
    h = Holder()
    root = (("L", "func"),)
    assert pins._found_in_class(h, "plain", root)
    assert not pins._found_in_class(h, "computed", root)
    assert not pins._found_in_class(h, "other", root)  # its attribute is in no dict: the getter raises


def test_a_read_past_the_class_lookup_is_pinned_by_the_instance_dict():
    """Dynamo 2.11 reads a config's attribute as `object.__getattribute__(config, 'name')`: object's own lookup whatever
    the class defines, so the instance dict pins it (pins._in_own_dict(generic=True)); unless a class has its own
    `__dict__` attribute, which need not give the instance dict."""
    from graphex.inference.pins import _Pins

    class Lies:
        def __init__(self):
            self.flag = 2.0

        def __getattribute__(self, key):
            return 99.0

    class OwnDict:
        def __init__(self):
            self.flag = 2.0

        @property
        def __dict__(self):
            return {"flag": 3.0}

    assert _Pins()._in_own_dict(Lies(), "flag", generic=True)
    assert not _Pins()._in_own_dict(Lies(), "flag")  # its own lookup: not object's
    assert not _Pins()._in_own_dict(OwnDict(), "flag", generic=True)
    assert not _Pins()._in_own_dict(Lies(), "missing", generic=True)
