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


@pytest.mark.parametrize("window", [64, "auto"])
def test_prefill_absorbs_only_what_the_drafter_reads(pair, window):
    """The drafter's context after a long prefill is the one a full absorb leaves,
    and only the positions it can read went through it."""
    from dflash_mlx.engine.prefill import prefill
    from dflash_mlx.generate import make_prompt_cache
    from dflash_mlx.models.target import Target

    model, _, d = pair
    draft = load_draft(str(d), target=model, sliding_window_size=window)
    reach = draft.reach()
    prompt = [(5 * i + 1) % 250 + 4 for i in range(LONG)]
    absorbed = []
    absorb = draft.absorb

    def counted(features, cache, counts=None):
        absorbed.append(features.shape[1])
        return absorb(features, cache, counts)

    target = Target(model, draft.args.target_layer_ids)
    full = make_prompt_cache(model, draft)
    for i in range(0, LONG, 1024):  # every position through the drafter
        _, features = target(mx.array([prompt[i : i + 1024]]), full.target)
        absorb(features, full.draft)
    draft.absorb = counted  # this instance only
    cache = make_prompt_cache(model, draft)
    prefill(target, draft, cache, prompt, 1024)
    assert sum(absorbed) == reach < LONG
    for got, want in zip(cache.draft, full.draft, strict=True):
        assert got.offset == want.offset == LONG
        for a, b in zip(got.kept(), want.kept(), strict=True):
            assert a.shape == b.shape
            assert mx.allclose(a, b, atol=1e-4).item()


def test_the_prefill_reports_its_progress_as_mlx_lm_does(pair):
    """(done, total) at the start and after each chunk; a reused prefix counts as
    done; the tokens are the same as without the callback."""
    from dflash_mlx.generate import make_prompt_cache

    model, tok, d = pair
    draft = load_draft(str(d), target=model)
    prompt = [(7 * i + 3) % 250 + 4 for i in range(50)]
    heard = []
    cache = make_prompt_cache(model, draft)
    out, _ = spec(
        model,
        draft,
        tok,
        prompt,
        max_tokens=4,
        prefill_step_size=16,
        prompt_cache=cache,
        prompt_progress_callback=lambda done, total: heard.append((done, total)),
    )
    assert heard == [(0, 50), (16, 50), (32, 50), (48, 50), (50, 50)]
    assert out == spec(model, draft, tok, prompt, max_tokens=4)[0]
    heard.clear()
    longer = prompt + out + [9, 10, 11]
    spec(
        model,
        draft,
        tok,
        longer,
        max_tokens=2,
        prompt_cache=cache,
        prompt_progress_callback=lambda done, total: heard.append((done, total)),
    )
    kept = len(prompt) + len(out) - 1  # the last answer token was never fed
    assert heard == [(kept, len(longer)), (len(longer), len(longer))]
