"""Helpers for the lossless claim: plain mlx-lm greedy decoding is the reference."""

import dataclasses

import mlx_lm
from oracles import OracleDraft

from dflash_mlx import stream_generate

PROMPTS = ["hello world, this is a test", "1, 2, 3, 4,", "The quick brown fox"]


def plain(model, tok, prompt, max_tokens):
    """mlx-lm's own greedy tokens."""
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
    """(tokens, responses) of a DFlash generation."""
    responses = list(stream_generate(model, draft, tok, prompt, **kw))
    return [t for r in responses for t in r.tokens], responses


def oracle(draft, reference, wrong=lambda k, i: False, block_size=None):
    """`draft`'s weights, proposing `reference` except where `wrong(k, i)`; with
    `block_size`, declaring that block size (stream_generate caps larger ones)."""
    args = draft.args
    if block_size is not None:
        args = dataclasses.replace(args, block_size=block_size)
    o = OracleDraft(args, reference, wrong)
    o.update(draft.parameters())
    return o
