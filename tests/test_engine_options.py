"""Per-generation engine options: seeds, target log-probabilities, cache owners."""

import mlx.core as mx
import mlx_lm
import pytest

from dflash_mlx import load, load_draft, make_prompt_cache, stream_generate

PROMPT = "The quick brown fox"


@pytest.fixture(scope="module")
def pair(tiny_pair):
    t, d = tiny_pair("qwen3")
    model, tok = load(str(t))
    tok.eos_token_ids = set()  # long answers: every block size gets exercised
    return model, tok, load_draft(str(d))


def _tokens(responses):
    return [t for r in responses for t in r.tokens]


def _sampled(pair, seed, **kw):
    model, tok, draft = pair
    kw = {"max_tokens": 24, "block_size": 4, "temperature": 1.0, **kw}
    return _tokens(stream_generate(model, draft, tok, PROMPT, seed=seed, **kw))


def test_same_seed_same_output_whatever_the_global_state(pair):
    mx.random.seed(1)
    a = _sampled(pair, 123)
    mx.random.seed(2)
    b = _sampled(pair, 123)
    assert a == b
    assert len({tuple(_sampled(pair, s)) for s in range(4)}) > 1  # seeds matter


@pytest.mark.parametrize("top_p", [1.0, 0.8])
def test_seeded_output_does_not_depend_on_the_block_sizes(pair, top_p):
    """Each token is the target's seeded draw at its position: plain decoding, fixed
    blocks and "auto" (sizes from timings) all give the same output."""
    model, tok, draft = pair
    runs = {
        b: _sampled(pair, 11, block_size=b, top_p=top_p, max_tokens=40)
        for b in (1, 2, 4, 8, "auto")
    }
    plain = _tokens(
        stream_generate(
            model, None, tok, PROMPT, max_tokens=40, temperature=1.0, top_p=top_p,
            seed=11,
        )
    )  # fmt: skip
    assert all(out == plain for out in runs.values()), runs


def test_interleaved_seeded_generations_equal_their_solo_runs(pair):
    model, tok, draft = pair
    solo = {s: _sampled(pair, s, top_p=0.9) for s in (5, 6)}
    gens = {
        s: stream_generate(
            model,
            draft,
            tok,
            PROMPT,
            max_tokens=24,
            block_size=4,
            temperature=1.0,
            top_p=0.9,
            seed=s,
        )
        for s in (5, 6)
    }
    got: dict[int, list[int]] = {5: [], 6: []}
    live = dict(gens)
    while live:  # one block of each in turn, as a server's engine thread does
        for s, gen in list(live.items()):
            r = next(gen, None)
            if r is None:
                del live[s]
            else:
                got[s].extend(r.tokens)
    assert got == solo


@pytest.mark.parametrize("block_size", [1, 4, "auto"])
def test_logprobs_are_the_targets_log_softmax(pair, block_size):
    model, tok, draft = pair
    prompt = tok.encode(PROMPT)
    responses = list(
        stream_generate(
            model,
            draft,
            tok,
            prompt,
            max_tokens=12,
            block_size=block_size,
            logprobs=3,
        )
    )
    tokens = _tokens(responses)
    rows = [row for r in responses for row in r.logprobs]
    assert len(rows) == len(tokens)
    logits = model(mx.array([prompt + tokens]))[0, len(prompt) - 1 : -1]
    expected = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    for i, (token, (logprob, top)) in enumerate(zip(tokens, rows, strict=True)):
        assert logprob == pytest.approx(expected[i, token].item(), abs=1e-4)
        best = mx.argsort(-expected[i])[:3].tolist()
        assert [t for t, _ in top] == best  # greedy: the committed token is the best
        assert top[0][0] == token
        values = [v for _, v in top]
        assert values == sorted(values, reverse=True)
        assert values[0] == pytest.approx(expected[i, best[0]].item(), abs=1e-4)


def test_logprobs_off_by_default(pair):
    model, tok, draft = pair
    assert all(
        r.logprobs is None
        for r in stream_generate(model, draft, tok, PROMPT, max_tokens=5)
    )


def test_a_prompt_cache_has_one_live_generation(pair):
    model, tok, draft = pair
    cache = make_prompt_cache(model, draft)
    first = stream_generate(model, draft, tok, PROMPT, max_tokens=8, prompt_cache=cache)
    next(first)
    second = stream_generate(
        model, draft, tok, PROMPT, max_tokens=8, prompt_cache=cache
    )
    with pytest.raises(ValueError, match="in use by another generation"):
        next(second)
    first.close()  # ends the first generation: the cache is free again
    assert _tokens(
        stream_generate(model, draft, tok, PROMPT, max_tokens=8, prompt_cache=cache)
    ) == [
        r.token
        for r in mlx_lm.stream_generate(model, tok, tok.encode(PROMPT), max_tokens=8)
    ]
    assert not cache.in_use and cache.nbytes > 0
