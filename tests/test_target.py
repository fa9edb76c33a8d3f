"""Exact rollback: after a partly rejected block the target cache equals a fresh run."""

import mlx.core as mx
import pytest

import tiny
from dflash_mlx import Target, load


def _states(cache):
    out = []
    for c in cache:
        if hasattr(c, "offset"):
            out.append(("kv", c.offset, c.keys[..., : c.offset, :], c.values[..., : c.offset, :]))
        else:
            out.append(("delta", c[0], c[1]))
    return out


def _assert_same(a, b, exact=False):
    for x, y in zip(_states(a), _states(b)):
        assert x[0] == y[0]
        if x[0] == "kv":
            assert x[1] == y[1]
        for u, v in zip(x[2:] if x[0] == "delta" else x[2:], y[2:]):
            if exact:
                assert mx.array_equal(u, v)
            else:
                assert mx.allclose(u, v, atol=1e-5, rtol=1e-5), float(mx.max(mx.abs(u - v)))


@pytest.fixture(scope="module")
def targets(models_dir):
    out = {}
    for family in ["llama", "qwen3_5", "qwen3_5_moe", "gemma4_text", "gemma4", "gpt_oss"]:
        path = models_dir / f"{family}-rollback"
        if not path.exists():
            tiny.make_target(path, family)
        model, _ = load(str(path))
        out[family] = Target(model, [1, 2])
    return out


@pytest.mark.parametrize("family", ["llama", "qwen3_5", "qwen3_5_moe", "gemma4_text", "gemma4", "gpt_oss"])
@pytest.mark.parametrize("keep", [0, 1, 3, 7, 8])
def test_rollback_equals_fresh_run(targets, family, keep):
    target = targets[family]
    prompt = mx.array([[5, 17, 99, 3, 42, 42, 7, 250, 1, 64]])
    block = mx.array([[11, 12, 13, 14, 15, 16, 17, 18]])

    spec = target.make_cache()
    target(prompt, spec)
    mx.eval([c.state for c in spec])
    before = _states(spec)
    tape = []
    _, features = target(block, spec, tape)
    target.rollback(spec, tape, block.shape[1], keep)
    mx.eval([c.state for c in spec])

    fresh = target.make_cache()
    target(prompt, fresh)
    if keep:
        target(block[:, :keep], fresh)
    mx.eval([c.state for c in fresh])
    _assert_same(spec, fresh, exact=keep == 0)
    if keep == 0:
        for x, y in zip(before, _states(spec)):
            assert all(mx.array_equal(u, v) for u, v in zip(x[1:], y[1:]) if isinstance(u, mx.array))

    # and the next forward from the rolled-back cache matches the fresh one
    nxt = mx.array([[200, 201]])
    h1, f1 = target(nxt, spec)
    h2, f2 = target(nxt, fresh)
    assert mx.allclose(target.logits(h1), target.logits(h2), atol=1e-4)
    assert mx.allclose(f1, f2, atol=1e-4)


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
    assert mx.allclose(fused, expected, rtol=1e-5, atol=1e-4)  # CPU: cpu_ops' own kernels


def test_logits_match_the_model(targets):
    for target in targets.values():
        tokens = mx.array([[9, 8, 7, 6, 5]])
        hidden, _ = target(tokens, target.make_cache())
        assert mx.allclose(target.logits(hidden), target.model(tokens), atol=1e-4)
