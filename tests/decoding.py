"""Runs shared by the losslessness tests: plain mlx-lm decoding and our engine."""

import mlx_lm

from dflash_mlx import stream_generate

PROMPTS = ["hello world, this is a test", "1, 2, 3, 4,", "The quick brown fox"]


def plain(model, tok, prompt, max_tokens):
    """Greedy tokens from plain mlx-lm decoding: the reference output."""
    return [
        r.token
        for r in mlx_lm.stream_generate(model, tok, prompt, max_tokens=max_tokens)
    ]


def long_prompt(model, tok, n=40):
    """A prompt whose greedy continuation runs n tokens without hitting EOS."""
    for text in PROMPTS + ["Once upon a time", "abc abc abc", "def f(x):"]:
        ids = tok.encode(text)
        if len(plain(model, tok, ids, n)) == n:
            return ids
    raise AssertionError("no long prompt for this tiny model")


def spec(model, draft, tok, prompt, **kw):
    """(all tokens, responses) from this package's `stream_generate`."""
    responses = list(stream_generate(model, draft, tok, prompt, **kw))
    return [t for r in responses for t in r.tokens], responses
