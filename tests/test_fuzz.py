"""Seeded fuzzing of `stream_generate` on a tiny pair: random prompt ids, block sizes
and sampling values, valid or not. Every call either ends cleanly (tokens in the
vocabulary, within max_tokens, a finish reason; greedy output equal to plain decoding)
or raises a ValueError; never another exception, never a crash. Bounded and seeded: a
few seconds."""

import math
import random
import warnings

import pytest

from dflash_mlx import load, load_draft, stream_generate

VOCAB = 272  # tiny.BYTE_VOCAB
DRAWS = 200


@pytest.fixture(scope="module")
def pair(tiny_pair):
    t, d = tiny_pair("qwen3")
    model, tokenizer = load(str(t))
    return model, tokenizer, load_draft(str(d), target=model)


def _prompt(rng: random.Random):
    ids = [rng.randrange(VOCAB) for _ in range(rng.randint(1, 12))]
    roll = rng.random()
    if roll < 0.1:
        ids[rng.randrange(len(ids))] = rng.choice([VOCAB, 10**6, -1, -(10**9)])
    elif roll < 0.14:
        ids = []
    elif roll < 0.18:
        ids[0] = ids[0] + 0.5
    return ids


# (valid, invalid) values per argument; each draw takes an invalid one now and then
VALUES = {
    "block_size": ([None, "auto", 1, 2, 3, 8, 9, 64, 10**6], [0, -3, 2.5]),
    "temperature": ([0.0, 0.0, 0.5, 1.0, 1e-6, 50.0], [math.nan, math.inf, -0.5]),
    "top_p": ([1.0, 1.0, 0.9, 0.0, 1e-9], [1.5, math.nan]),
    "top_k": ([0, 0, 1, 5, 10**6], [-1, 2.5]),
    "min_p": ([0.0, 0.0, 0.1, 1.0], [-0.1, math.nan]),
    "seed": ([None, 0, 7, 2**64 - 1], [-1, 2**64]),
}


def _draw(rng: random.Random) -> dict:
    case = {
        name: rng.choice(invalid if rng.random() < 0.08 else valid)
        for name, (valid, invalid) in VALUES.items()
    }
    max_tokens = rng.randint(-3, 24)
    case["max_tokens"] = 8 if max_tokens == -1 else max_tokens  # -1: to the context
    case["prompt"] = _prompt(rng)
    return case


def _generate(pair, case: dict):
    model, tokenizer, draft = pair
    kwargs = dict(case)
    prompt = kwargs.pop("prompt")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # the block-size cap's note
        return list(stream_generate(model, draft, tokenizer, prompt, **kwargs))


def _check_finished(responses, case: dict):
    tokens = [t for r in responses for t in r.tokens]
    assert tokens and all(isinstance(t, int) and 0 <= t < VOCAB for t in tokens)
    assert len(tokens) <= case["max_tokens"]
    assert responses[-1].finish_reason in ("stop", "length")
    assert all(r.finish_reason is None for r in responses[:-1])
    assert "".join(r.text for r in responses) == "".join(
        "".join(r.token_texts) for r in responses
    )
    return tokens


def test_random_inputs_end_cleanly_or_are_refused(pair):
    rng = random.Random(20240613)
    refused, finished = 0, 0
    model, tokenizer, _ = pair
    for _ in range(DRAWS):
        case = _draw(rng)
        try:
            responses = _generate(pair, case)
        except ValueError as e:
            message = str(e)
            assert len(message) > 20 and message[-1] in ".)", (case, message)
            refused += 1
            continue
        tokens = _check_finished(responses, case)
        finished += 1
        if case["temperature"] == 0:  # greedy: the same tokens as plain decoding
            plain = list(
                stream_generate(
                    model,
                    None,
                    tokenizer,
                    case["prompt"],
                    max_tokens=case["max_tokens"],
                )
            )
            assert tokens == [t for r in plain for t in r.tokens], case
    assert refused >= 40 and finished >= 40, (refused, finished)
