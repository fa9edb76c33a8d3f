"""Greedy losslessness of the speculative loop against plain mlx-lm decoding."""

import mlx.core as mx
import mlx_lm
import pytest
import tiny
from lossless import PROMPTS, long_prompt, oracle, plain, spec
from mlx.utils import tree_flatten

from dflash_mlx import load, load_draft, make_prompt_cache, stream_generate

FAMILIES = list(tiny.FAMILIES)


@pytest.fixture(scope="module")
def loaded(tiny_pair):
    cache = {}

    def get(family):
        if family not in cache:
            t, d = tiny_pair(family)
            model, tok = load(str(t))
            cache[family] = (model, tok, load_draft(str(d)))
        return cache[family]

    return get


@pytest.mark.parametrize("family", FAMILIES)
def test_random_drafter_equals_plain_greedy(loaded, family):
    model, tok, draft = loaded(family)
    for prompt in PROMPTS:
        ref = plain(model, tok, prompt, 24)
        out, responses = spec(model, draft, tok, prompt, max_tokens=24)
        assert out == ref
        assert sum(r.accepted or 1 for r in responses) == len(ref)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("pattern", ["full", "partial", "none"])
def test_forced_acceptance_patterns(loaded, family, pattern):
    """Oracle drafters: every block accepted, accepted up to a mistake, or rejected."""
    model, tok, draft = loaded(family)
    prompt = long_prompt(model, tok)
    ref = plain(model, tok, prompt, 40)
    wrong = {
        "full": lambda k, i: False,
        "partial": lambda k, i: k == 3,
        "none": lambda k, i: True,
    }[pattern]
    expected_tau = {"full": 8, "partial": 3, "none": 1}[pattern]
    out, responses = spec(
        model,
        oracle(draft, prompt + ref, wrong),
        tok,
        prompt,
        max_tokens=40,
        block_size=8,
    )
    assert out == ref
    taus = [r.accepted for r in responses[1:-1]]
    assert taus and all(t == expected_tau for t in taus), taus
    assert all(r.from_draft == r.accepted - 1 for r in responses[1:-1])


@pytest.mark.parametrize("family", ["qwen3", "qwen3_5"])
def test_every_block_size(loaded, family):
    model, tok, draft = loaded(family)
    prompt = long_prompt(model, tok, 33)
    ref = plain(model, tok, prompt, 33)
    half = oracle(draft, prompt + ref, lambda k, i: i % 5 == 0, block_size=16)
    for block_size in range(1, 17):
        out, responses = spec(
            model, half, tok, prompt, max_tokens=33, block_size=block_size
        )
        assert out == ref, block_size
        assert all(r.block_size <= block_size for r in responses)


@pytest.mark.parametrize("max_tokens", [1, 2, 7, 8, 9, 30])
def test_max_tokens_inside_a_block(loaded, max_tokens):
    model, tok, draft = loaded("llama")
    prompt = long_prompt(model, tok)
    ref = plain(model, tok, prompt, max_tokens)
    out, responses = spec(
        model,
        oracle(draft, prompt + plain(model, tok, prompt, 40)),
        tok,
        prompt,
        max_tokens=max_tokens,
        block_size=8,
    )
    assert out == ref and len(out) == max_tokens
    assert responses[-1].finish_reason == "length"
    assert responses[-1].generation_tokens == max_tokens


@pytest.mark.parametrize("family", ["llama", "qwen3_5"])
@pytest.mark.parametrize("stop_at", [0, 1, 5, 11])
def test_eos_inside_a_block(loaded, family, stop_at):
    model, tok, draft = loaded(family)
    prompt = long_prompt(model, tok)
    ref = plain(model, tok, prompt, 40)
    eos = ref[stop_at]  # generation stops at its first occurrence
    saved = tok.eos_token_ids
    tok.eos_token_ids = {eos}
    try:
        expected = plain(model, tok, prompt, 40)
        text = "".join(
            r.text for r in mlx_lm.stream_generate(model, tok, prompt, max_tokens=40)
        )
        out, responses = spec(
            model, oracle(draft, prompt + ref), tok, prompt, max_tokens=40, block_size=8
        )
    finally:
        tok.eos_token_ids = saved
    assert out == expected and out[-1] == eos
    assert responses[-1].finish_reason == "stop"
    assert "".join(r.text for r in responses) == text


def test_prompt_forms_agree(loaded):
    model, tok, draft = loaded("qwen3")
    ids = tok.encode(PROMPTS[0])
    a, _ = spec(model, draft, tok, PROMPTS[0], max_tokens=12)
    b, _ = spec(model, draft, tok, ids, max_tokens=12)
    c, _ = spec(model, draft, tok, mx.array(ids), max_tokens=12)
    assert a == b == c


def test_no_drafter_is_plain_decoding(loaded):
    model, tok, _ = loaded("qwen3_5")
    ref = plain(model, tok, PROMPTS[0], 20)
    out, responses = spec(model, None, tok, PROMPTS[0], max_tokens=20)
    assert out == ref and all(r.from_draft == 0 for r in responses)


@pytest.mark.parametrize("family", ["qwen3", "qwen3_5"])
def test_prompt_cache_reuse_matches_fresh_runs(loaded, family):
    model, tok, draft = loaded(family)
    cache = make_prompt_cache(model, draft)
    history = tok.encode("turn one:")
    for turn in range(3):
        out, responses = spec(
            model, draft, tok, history, max_tokens=10, prompt_cache=cache
        )
        fresh, _ = spec(model, draft, tok, history, max_tokens=10)
        assert out == fresh
        if turn:
            assert responses[0].reused_tokens > 0
        history = history + out + tok.encode(f" next {turn}:")


@pytest.mark.parametrize("family", ["qwen3", "qwen3_5"])
def test_interrupted_generation_leaves_a_consistent_cache(loaded, family):
    model, tok, draft = loaded(family)
    prompt = long_prompt(model, tok)
    ref = plain(model, tok, prompt, 40)
    drafter = oracle(draft, prompt + ref, lambda k, i: k == 4)
    cache = make_prompt_cache(model, drafter)
    gen = stream_generate(
        model, drafter, tok, prompt, max_tokens=40, block_size=8, prompt_cache=cache
    )
    got = [t for _, r in zip(range(3), gen, strict=False) for t in r.tokens]
    gen.close()
    assert cache.tokens == prompt + got[:-1]
    assert all(c.offset == len(cache.tokens) for c in cache.draft)
    # continuing from the partial answer gives what a fresh run gives
    follow = prompt + got
    out, _ = spec(model, drafter, tok, follow, max_tokens=12, prompt_cache=cache)
    assert out == plain(model, tok, follow, 12)


@pytest.mark.parametrize("family", ["qwen3", "qwen3_5"])
def test_plain_steps_end_with_nothing_left_in_flight(loaded, family):
    """Plain steps ending on a stop token, on the budget or by an early close leave
    the caches holding exactly the committed tokens, and a next turn matches a fresh
    run."""
    from dflash_mlx.engine.loop import generate_blocks
    from dflash_mlx.models.target import Target
    from dflash_mlx.sampling import SamplingParams

    model, tok, draft = loaded(family)
    prompt = long_prompt(model, tok)
    ref = plain(model, tok, prompt, 40)
    stop = next(i for i, t in enumerate(ref) if i >= 5 and t not in ref[:i])
    target = Target(model, draft.args.target_layer_ids)

    def consistent(cache, got):
        assert cache.tokens == prompt + got[:-1]
        assert all(c.offset == len(cache.tokens) for c in cache.draft)
        follow = prompt + got
        out, _ = spec(model, draft, tok, follow, max_tokens=8, prompt_cache=cache)
        assert out == plain(model, tok, follow, 8)

    for stops, budget, close_after in (
        (frozenset({ref[stop]}), 40, None),  # ends on a stop token
        (frozenset(), 7, None),  # ends on the budget
        (frozenset(), 40, 6),  # the consumer closes it
    ):
        cache = make_prompt_cache(model, draft)
        gen = generate_blocks(
            target, draft, prompt, cache, SamplingParams(), 1, budget, stops
        )
        blocks = list(zip(range(close_after or budget + 1), gen, strict=False))
        gen.close()
        got = [t for _, b in blocks for t in b.tokens]
        want = ref[: stop + 1] if stops else ref[: close_after or budget]
        assert got == want
        consistent(cache, got)


def test_response_fields(loaded):
    model, tok, draft = loaded("llama")
    prompt = long_prompt(model, tok)
    responses = list(stream_generate(model, draft, tok, prompt, max_tokens=10))
    first, last = responses[0], responses[-1]
    assert first.accepted is None and first.prompt_tokens == len(prompt)
    assert last.generation_tokens == 10 and last.finish_reason == "length"
    assert last.prompt_tps > 0 and last.generation_tps > 0 and last.peak_memory > 0
    assert all(r.finish_reason is None for r in responses[:-1])


def test_weights_unchanged_by_generation(loaded):
    """The engine must not alter the user's model (no patching of layers or classes)."""
    model, tok, draft = loaded("qwen3_5")
    before = {k: v for k, v in tree_flatten(model.parameters())}
    layers = list(model.layers)
    list(stream_generate(model, draft, tok, PROMPTS[0], max_tokens=6))
    assert list(model.layers) == layers
    assert all(type(x).__module__.startswith("mlx_lm") for x in model.layers)
    assert {k for k, _ in tree_flatten(model.parameters())} == set(before)


def test_plain_blocks_leave_the_drafter_idle_until_it_drafts(loaded):
    """The drafter takes in the features of plain blocks at its next draft, in one
    forward (at most MAX_UNABSORBED blocks behind), and ends holding what one prefill
    of the same tokens gives it."""
    from dflash_mlx.engine.loop import MAX_UNABSORBED, generate_blocks
    from dflash_mlx.models.target import Target
    from dflash_mlx.sampling import SamplingParams

    model, tok, draft = loaded("qwen3")
    prompt = long_prompt(model, tok)
    sizes = [1] * (MAX_UNABSORBED + 5) + [4, 1, 1, 2] + [1] * 6

    class Scripted:
        def __init__(self):
            self.seen = 0

        def next(self, limit=None):
            size = sizes[min(self.seen, len(sizes) - 1)]
            self.seen += 1
            return max(1, min(size, limit or size))

        def observe(self, *args, **kwargs):
            pass

    target = Target(model, draft.args.target_layer_ids)
    cache = make_prompt_cache(model, draft)
    lags = []
    gen = generate_blocks(
        target, draft, prompt, cache, SamplingParams(), Scripted(), 40
    )
    for _ in gen:
        lags.append(len(cache.tokens) - cache.draft[0].offset)
    assert max(lags) == MAX_UNABSORBED - 1  # it waited, and not for ever
    assert lags[MAX_UNABSORBED + 4] > 0 == lags[MAX_UNABSORBED + 5]  # then the 4
    assert all(c.offset == len(cache.tokens) for c in cache.draft)
    fresh = make_prompt_cache(model, draft)
    _, features = target(mx.array([cache.tokens]), fresh.target)
    draft.absorb(features, fresh.draft)
    for ours, once in zip(cache.draft, fresh.draft, strict=True):
        n = ours.offset
        for a, b in ((ours.keys, once.keys), (ours.values, once.values)):
            assert mx.allclose(a[..., :n, :], b[..., :n, :], atol=1e-4, rtol=1e-4)
