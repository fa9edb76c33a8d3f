"""Prompts past the drafter's default context window: the window bounds what the
drafter keeps (and so a block's cost), never the output."""

import mlx.core as mx
import pytest
import tiny
from lossless import plain, spec

from dflash_mlx import load, load_draft
from dflash_mlx.loading.drafters import DEFAULT_CONTEXT_WINDOW
from dflash_mlx.models.cache import WindowedKVCache

LONG = DEFAULT_CONTEXT_WINDOW + 900  # prompt tokens: past the window


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    folder = tmp_path_factory.mktemp("long")
    t = tiny.make_target(folder / "t", "qwen3", max_position_embeddings=8192)
    d = tiny.make_draft(folder / "d", t, max_position_embeddings=8192)
    model, tok = load(str(t))
    return model, tok, d


def test_a_drafter_without_a_window_keeps_the_default_one(pair):
    model, _, d = pair
    draft = load_draft(str(d), target=model)
    assert set(draft.args.layer_types) == {"full_attention"}
    assert draft.context_window == DEFAULT_CONTEXT_WINDOW
    cache = draft.make_cache()
    assert all(isinstance(c, WindowedKVCache) for c in cache)
    width = len(draft.args.target_layer_ids) * model.args.hidden_size
    for _ in range(3):  # 6,000 positions absorbed, in chunks
        draft.absorb(mx.zeros((1, 2000, width)), cache)
    assert [c.size() for c in cache] == [DEFAULT_CONTEXT_WINDOW] * len(cache)
    assert all(c.offset == 6000 for c in cache)  # RoPE positions stay absolute
    assert load_draft(str(d), sliding_window_size=None).context_window is None


@pytest.mark.parametrize("window", ["auto", None, 64])
def test_greedy_past_the_window_equals_plain_decoding(pair, window):
    model, tok, d = pair
    draft = load_draft(str(d), target=model, sliding_window_size=window)
    prompt = [(7 * i + 3) % 250 + 4 for i in range(LONG)]
    want = plain(model, tok, prompt, 24)
    got, _ = spec(model, draft, tok, prompt, max_tokens=24, block_size=8)
    assert got == want


@pytest.mark.parametrize("bad", [0, -5, "all", 2.5, True])
def test_a_window_that_is_not_a_size_is_refused(pair, bad):
    with pytest.raises(ValueError, match="sliding_window_size must be"):
        load_draft(str(pair[2]), sliding_window_size=bad)
