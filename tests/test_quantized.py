"""Quantized targets and drafts stay lossless; bounded draft context stays lossless."""

import mlx.core as mx
import mlx.nn as nn
import pytest
import tiny
from lossless import long_prompt, plain, spec
from oracles import OracleDraft

from dflash_mlx import load, load_draft
from dflash_mlx.models.cache import WindowedKVCache


@pytest.mark.parametrize(
    "family", ["llama", "qwen3", "qwen3_5", "qwen3_moe", "gemma4_text", "gpt_oss"]
)
@pytest.mark.parametrize("bits, mixed", [(4, False), (8, False), (4, True)])
def test_quantized_target_is_lossless(models_dir, tiny_pair, family, bits, mixed):
    t, d = tiny_pair(family)
    q = models_dir / f"{family}-q{bits}{'-mixed' if mixed else ''}"
    if not q.exists():
        tiny.quantize_target(t, q, bits, mixed)
    model, tok = load(str(q))
    assert any(isinstance(m, nn.QuantizedLinear) for _, m in model.named_modules())
    draft = load_draft(str(d))
    prompt = long_prompt(model, tok, 24)
    ref = plain(model, tok, prompt, 24)
    out, _ = spec(model, draft, tok, prompt, max_tokens=24)
    assert out == ref
    full = OracleDraft(draft.args, prompt + ref, lambda k, i: i % 6 == 0)
    full.update(draft.parameters())
    out, responses = spec(model, full, tok, prompt, max_tokens=24, block_size=8)
    assert out == ref and max(r.accepted or 0 for r in responses) > 3


@pytest.mark.parametrize("bits, min_agreement", [(8, 0.95), (4, 0.6)])
def test_quantized_draft(tiny_pair, bits, min_agreement):
    t, d = tiny_pair("qwen3")
    model, tok = load(str(t))
    full, quant = load_draft(str(d)), load_draft(str(d), bits=bits)
    assert sum(isinstance(m, nn.QuantizedLinear) for _, m in quant.named_modules()) >= 8
    prompt = long_prompt(model, tok, 24)
    ref = plain(model, tok, prompt, 24)
    out, _ = spec(model, quant, tok, prompt, max_tokens=24)
    assert out == ref

    from dflash_mlx import Target

    target = Target(model, full.args.target_layer_ids)
    _, features = target(mx.array([prompt]), target.make_cache())
    block = mx.array([[prompt[-1]] + [full.args.mask_token_id] * 7])
    picks = []
    for drafter in (full, quant):
        cache = drafter.make_cache()
        drafter.absorb(features, cache)
        picks.append(
            mx.argmax(target.logits(drafter(target.embed(block), cache)), axis=-1)
        )
    agreement = mx.mean(picks[0] == picks[1]).item()
    assert agreement >= min_agreement, agreement


def test_stored_quantized_draft_checkpoint(tmp_path, tiny_pair):
    import json
    import shutil

    from mlx.utils import tree_flatten

    _, d = tiny_pair("qwen3")
    quant = load_draft(str(d), bits=4)
    q = tmp_path / "q4"
    q.mkdir()
    mx.save_safetensors(
        str(q / "model.safetensors"), dict(tree_flatten(quant.parameters()))
    )
    config = json.loads((d / "config.json").read_text())
    config["quantization"] = {"group_size": 64, "bits": 4}
    (q / "config.json").write_text(json.dumps(config))
    again = load_draft(str(q))
    for (k1, v1), (k2, v2) in zip(
        tree_flatten(quant.parameters()), tree_flatten(again.parameters()), strict=True
    ):
        assert k1 == k2 and mx.array_equal(v1, v2)
    shutil.rmtree(q)


def test_float16_draft_never_runs_in_float16(tmp_path, tiny_pair):
    t, _ = tiny_pair("llama")
    d = tiny.make_draft(tmp_path / "d16", t)
    w = mx.load(str(d / "model.safetensors"))
    mx.save_safetensors(
        str(d / "model.safetensors"), {k: v.astype(mx.float16) for k, v in w.items()}
    )
    draft = load_draft(str(d))
    # bfloat16 on a GPU (float16 overflows), float32 on the CPU (half precision is slow)
    assert draft.dtype == (mx.float32 if mx.default_device() == mx.cpu else mx.bfloat16)
    model, tok = load(str(t))
    model.set_dtype(mx.float16)
    prompt = long_prompt(model, tok, 12)
    out, _ = spec(model, draft, tok, prompt, max_tokens=12)
    assert out == plain(model, tok, prompt, 12)


@pytest.mark.parametrize("family", ["qwen3", "qwen3_5"])
def test_bounded_draft_context(tiny_pair, family):
    t, d = tiny_pair(family)
    model, tok = load(str(t))
    draft = load_draft(str(d), sliding_window_size=5)
    prompt = long_prompt(model, tok, 30)
    ref = plain(model, tok, prompt, 30)
    drafter = OracleDraft(draft.args, prompt + ref, lambda k, i: i % 9 == 0)
    drafter.update(draft.parameters())
    drafter.context_window = 5
    from dflash_mlx import make_prompt_cache

    cache = make_prompt_cache(model, drafter)
    out, responses = spec(
        model, drafter, tok, prompt, max_tokens=30, block_size=8, prompt_cache=cache
    )
    assert out == ref and max(r.accepted for r in responses[1:]) == 8
    assert all(isinstance(c, WindowedKVCache) and c.size() <= 5 for c in cache.draft)
    assert all(c.offset == len(cache.tokens) for c in cache.draft)
    out, _ = spec(model, draft, tok, prompt, max_tokens=30)
    assert out == ref
