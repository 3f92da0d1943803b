"""Decode with a transformers StaticCache through cache_compile (tests/python/test_cache_static_kv.py).

    python cache_static_kv.py CACHE_DIR MODEL   prints one JSON line: {stats, equal, cache_equal, equal_eager, ...}

The call is the one transformers makes (`input_ids=..., past_key_values=StaticCache(...), cache_position=...`):
the tensors the cache object holds are bound through their paths (Note [A tensor an argument holds is bound
through its path]). The same trace run by aot_eager decodes the same steps on its own cache: logits and caches are compared bitwise;
eager on a third cache too.
"""
import json
import sys

import torch
import transformers

import graphex

CACHE_DIR, MODEL = sys.argv[1], sys.argv[2]
transformers.logging.set_verbosity_error()


def build():
    torch.manual_seed(0)
    if MODEL == "llama":
        cfg = transformers.LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
        return cfg, transformers.LlamaForCausalLM(cfg).eval()
    cfg = transformers.GPT2Config(vocab_size=128, n_embd=64, n_layer=2, n_head=4, n_positions=64)
    return cfg, transformers.GPT2LMHeadModel(cfg).eval()


def main():
    cfg, model = build()
    caches = [transformers.StaticCache(config=cfg, max_cache_len=32) for _ in range(3)]  # graphex, ref, eager
    fn = graphex.inference.cache_compile(model.forward, cache_dir=CACHE_DIR)
    # The reference: the same trace run by torch's own kernels (aot_eager). Under torch.compile transformers builds
    # its attention mask another way than in eager (Llama: logits 6e-8 apart at the first step, for aot_eager as
    # for graphex, and the caches drift from there), so eager is compared bitwise only where the trace is eager's.
    ref = torch.compile(model.forward, backend="aot_eager", fullgraph=True, dynamic=False)
    python_calls = [0]
    python_path = fn._call

    def counted(*args, **kwargs):  # the calls the C++ fast path left to Python (Note [A plain call's fast path ...])
        python_calls[0] += 1
        return python_path(*args, **kwargs)

    fn._call = counted
    tokens = [5, 9, 2, 7, 1]
    equal = equal_eager = True
    max_abs_eager = 0.0
    with torch.no_grad():
        for c in caches:  # the first step initializes a StaticCache's layers (a side effect: run in eager)
            model(input_ids=torch.tensor([[3]]), past_key_values=c, cache_position=torch.tensor([0]), use_cache=True)
        for step, tok in enumerate(tokens, start=1):
            ids, pos = torch.tensor([[tok]]), torch.tensor([step])
            got = fn(input_ids=ids, past_key_values=caches[0], cache_position=pos, use_cache=True)
            want = ref(input_ids=ids, past_key_values=caches[1], cache_position=pos, use_cache=True)
            eager = model(input_ids=ids, past_key_values=caches[2], cache_position=pos, use_cache=True)
            equal &= bool(torch.equal(got.logits, want.logits)) and got.past_key_values is caches[0]
            equal_eager &= bool(torch.equal(got.logits, eager.logits))
            max_abs_eager = max(max_abs_eager, (got.logits - eager.logits).abs().max().item())
    cache_equal = all(torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values)
                      for a, b in zip(caches[0].layers, caches[1].layers))
    print(json.dumps({"stats": fn.stats, "equal": equal, "cache_equal": bool(cache_equal), "equal_eager": equal_eager,
                      "max_abs_eager": max_abs_eager, "python_calls": python_calls[0], "steps": len(tokens)}))


if __name__ == "__main__":
    main()
