"""Exact rollback: after a partly rejected block the target cache equals a fresh run."""

import mlx.core as mx
import pytest
import tiny
from numerics import assert_close, error_ratio

from dflash_mlx import Target, load

FAMILIES = [
    "llama",
    "qwen3_5",
    "qwen3_5_moe",
    "qwen3_next",
    "gemma3_text",
    "gemma4_text",
    "gemma4",
    "gpt_oss",
    "deepseek_v3",
    "kimi_k25",
    "minimax",
    "muse_glimmer",
    "glm_moe_dsa",
]
PROMPT = mx.array([[5, 17, 99, 3, 42, 42, 7, 250, 1, 64]])
BLOCK = mx.array([[11, 12, 13, 14, 15, 16, 17, 18]])


def _states(cache):
    """Per layer: (kind, length, arrays) — KV keys/values, or the conv and recurrent
    state."""
    out = []
    for c in cache:
        if hasattr(c, "caches"):  # a CacheList (glm_moe_dsa: attention + indexer)
            out += _states(c.caches)
        elif hasattr(c, "offset"):
            n = c.offset
            out.append(("kv", n, [c.keys[..., :n, :], c.values[..., :n, :]]))
        else:
            out.append(("delta", None, [c[0], c[1]]))
    return out


def _worst(a, b) -> float:
    """Largest error of cache `a` against cache `b`, in units of the float32
    tolerance."""
    worst = 0.0
    for depth, (x, y) in enumerate(zip(_states(a), _states(b), strict=True), start=1):
        assert x[:2] == y[:2], f"layer {depth - 1}: {x[:2]} vs {y[:2]}"
        for u, v in zip(x[2], y[2], strict=True):
            worst = max(worst, error_ratio(u, v, depth))
    return worst


def _verify_then_rollback(target, keep, block=BLOCK):
    cache = target.make_cache()
    target(PROMPT, cache)
    mx.eval([c.state for c in cache])
    before = _states(cache)
    tape = []
    target(block, cache, tape)
    target.rollback(cache, tape, block.shape[1], keep)
    mx.eval([c.state for c in cache])
    return cache, before


def _fresh(target, tokens):
    cache = target.make_cache()
    target(PROMPT, cache)
    if tokens.shape[1]:
        target(tokens, cache)
    mx.eval([c.state for c in cache])
    return cache


@pytest.fixture(scope="module")
def targets(models_dir):
    out = {}
    for family in FAMILIES:
        path = models_dir / f"{family}-rollback"
        if not path.exists():
            tiny.make_target(path, family)
        model, _ = load(str(path))
        out[family] = Target(model, [1, 2])
    return out


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("keep", [0, 1, 3, 7, 8])
def test_rollback_equals_fresh_run(targets, family, keep):
    target = targets[family]
    spec, before = _verify_then_rollback(target, keep)
    fresh = _fresh(target, BLOCK[:, :keep])
    if keep == 0:  # nothing replayed: the pre-block state, bit for bit
        for x, y in zip(before, _states(spec), strict=True):
            assert x[:2] == y[:2] and all(
                mx.array_equal(u, v) for u, v in zip(x[2], y[2], strict=True)
            )
    assert _worst(spec, fresh) <= 1.0

    # and the next forward from the rolled-back cache matches the fresh one
    nxt = mx.array([[200, 201]])
    h1, f1 = target(nxt, spec)
    h2, f2 = target(nxt, fresh)
    depth = target.num_layers + 1
    assert_close(target.logits(h1), target.logits(h2), depth, "logits")
    assert_close(f1, f2, depth, "features")


@pytest.mark.parametrize("family", FAMILIES)
def test_wrong_rollbacks_fail_the_tolerance(targets, family):
    """The tolerance still catches real rollback bugs, by orders of magnitude."""
    target, keep = targets[family], 3
    spec, _ = _verify_then_rollback(target, keep)
    other = BLOCK[:, :keep] + mx.array([[0, 0, 1]])  # the last kept token differs
    assert _worst(spec, _fresh(target, other)) > 100
    if target.recurrent:  # one token too many replayed: KV offsets catch the rest
        spec, _ = _verify_then_rollback(target, keep + 1)
        states = zip(
            _states(spec), _states(_fresh(target, BLOCK[:, :keep])), strict=True
        )
        worst = max(
            error_ratio(u, v, 1)
            for x, y in states
            if x[0] == "delta"
            for u, v in zip(x[2], y[2], strict=True)
        )
        assert worst > 100


def test_features_are_layer_outputs(targets):
    """Fused features = outputs of the requested layers, concatenated in order."""
    target = targets["llama"]
    tokens = mx.array([[1, 2, 3, 4]])
    _, fused = target(tokens, target.make_cache())
    inner = target.inner
    h = inner.embed_tokens(tokens)
    outs = []
    from mlx_lm.models.base import create_attention_mask

    mask = create_attention_mask(h, None)
    for layer in inner.layers:
        h = layer(h, mask, None)
        outs.append(h)
    expected = mx.concatenate([outs[1], outs[2]], axis=-1)
    assert fused.shape == (1, 4, 2 * target.hidden_size)
    assert_close(fused, expected, 3, "features")  # on the CPU: cpu_ops' own kernels


def test_logits_match_the_model(targets):
    for target in targets.values():
        tokens = mx.array([[9, 8, 7, 6, 5]])
        hidden, _ = target(tokens, target.make_cache())
        depth = target.num_layers + 1
        assert_close(
            target.logits(hidden), target.model(tokens), depth, target.model_type
        )
