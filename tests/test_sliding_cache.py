"""A target's sliding-window layers on bounded caches (`SlidingKVCache`): the same
attention as a whole-history cache under the window mask, through forwards and
rollbacks; lossless decoding past the window; memory that stops growing."""

import random

import mlx.core as mx
import pytest
from lossless import oracle, plain, spec
from mlx_lm.models.cache import KVCache

from dflash_mlx import load, load_draft
from dflash_mlx.generate import make_prompt_cache
from dflash_mlx.models.sliding_cache import SlidingKVCache

WINDOW = 8


def _attend(cache, q, k, v):
    N = q.shape[2]
    if isinstance(cache, SlidingKVCache):
        mask = cache.make_mask(N, window_size=WINDOW)
    else:
        mask = cache.make_mask(N, window_size=WINDOW, return_array=False)
    keys, values = cache.update_and_fetch(k, v)
    return mx.fast.scaled_dot_product_attention(q, keys, values, scale=0.5, mask=mask)


@pytest.mark.parametrize("seed", range(3))
def test_the_same_attention_as_a_whole_history_through_forwards_and_rollbacks(seed):
    rng = random.Random(seed)
    mx.random.seed(seed)
    bounded, whole = SlidingKVCache(WINDOW, slack=3), KVCache()
    for _ in range(60):
        n = rng.choice([1, 1, 2, 5, 9, 17])
        q, k, v = (mx.random.normal((1, 2, n, 4)) for _ in range(3))
        a, b = _attend(bounded, q, k, v), _attend(whole, q, k, v)
        assert mx.allclose(a, b, atol=1e-5).item()
        drop = rng.choice([0, 0, rng.randint(0, n)])  # a rejected tail of the block
        if drop:
            assert bounded.trim(drop) == whole.trim(drop) == drop
        assert bounded.offset == whole.offset
        assert bounded.size() <= WINDOW - 1 + 3 + 17  # bounded, whatever the context


def test_a_trim_past_the_window_is_refused_and_reported():
    cache = SlidingKVCache(WINDOW, slack=2)
    forward = lambda n: cache.update_and_fetch(*(mx.zeros((1, 1, n, 4)),) * 2)  # noqa: E731
    for _ in range(4):  # chunks longer than the slack bring their own
        forward(10)
    assert cache.size() == WINDOW - 1 + 10
    assert cache.trimmable_by(10) and not cache.trimmable_by(11)
    forward(1)  # a step keeps the slack from the chunk before it
    assert cache.size() == WINDOW - 1 + 2
    assert cache.trimmable_by(2) and not cache.trimmable_by(3)
    with pytest.raises(ValueError, match="8-token window"):
        cache.trim(3)


@pytest.fixture(scope="module")
def gemma(tiny_pair):
    t, d = tiny_pair("gemma3_text")
    model, tok = load(str(t))
    return model, tok, load_draft(str(d))


def _long_prompt(model, tok, n_tokens):
    words = " ".join(f"w{i % 37} x{i % 11}" for i in range(n_tokens))
    return tok.encode(words)[:n_tokens]


def test_lossless_and_bounded_far_past_window_and_slack(gemma):
    """300 positions of context, more than the window (8) and slack (256) together:
    the bounded caches evict, blocks are rolled back, tokens equal mlx-lm's."""
    model, tok, draft = gemma
    prompt = _long_prompt(model, tok, 300)
    ref = plain(model, tok, prompt, 32)
    half = oracle(draft, prompt + ref, lambda k, i: i % 4 == 0, block_size=8)
    cache = make_prompt_cache(model, half)
    out, responses = spec(
        model, half, tok, prompt, max_tokens=32, block_size=8, prompt_cache=cache
    )
    assert out == ref
    assert max(r.accepted or 0 for r in responses) > 2  # blocks were verified
    sliding = [c for c in cache.target if isinstance(c, SlidingKVCache)]
    assert sliding  # the tiny gemma has 3 sliding layers of 4
    for c in sliding:
        assert c.offset == len(prompt) + len(out) - 1
        assert c.size() < c.window + c.slack + 8  # not the whole context
    whole = [c for c in cache.target if not isinstance(c, SlidingKVCache)]
    assert all(c.offset == len(prompt) + len(out) - 1 for c in whole)


def test_a_chat_that_rewrites_older_history_starts_afresh_and_stays_exact(gemma):
    """A next prompt that keeps only an early part of the cached tokens cannot reuse
    a window that moved on: the cache starts over (no stale keys), same tokens."""
    model, tok, draft = gemma
    first = _long_prompt(model, tok, 300)
    cache = make_prompt_cache(model, draft)
    spec(model, draft, tok, first, max_tokens=8, prompt_cache=cache)
    second = first[:20] + tok.encode(" a different ending")
    out, _ = spec(model, draft, tok, second, max_tokens=16, prompt_cache=cache)
    assert out == plain(model, tok, second, 16)
    # a small re-render of the end (within the slack) keeps the cache
    cached = list(cache.tokens)
    third = cached[:-5] + tok.encode(" and more")
    assert cache.reuse(cache_target(model, draft), third) == len(cached) - 5


def cache_target(model, draft):
    from dflash_mlx.generate import as_target

    return as_target(model, draft)


def test_the_server_keeps_whole_histories(gemma):
    """The prefix store cuts caches at any token: its caches keep every position."""
    model, _, draft = gemma
    cache = make_prompt_cache(model, draft, windows=False)
    assert not any(isinstance(c, SlidingKVCache) for c in cache.target)


def test_a_batch_refuses_bounded_caches_and_says_how_to_make_whole_ones(gemma):
    from dflash_mlx.engine.batch import Batch, Request
    from dflash_mlx.generate import as_target

    model, _, draft = gemma
    batch = Batch(as_target(model, draft), draft, 2)
    with pytest.raises(ValueError, match="windows=False"):
        batch.join(Request(), make_prompt_cache(model, draft), 1)
