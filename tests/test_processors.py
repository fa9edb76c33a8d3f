"""Logits processors under speculation (engine/processors.py): each verified position
is processed with the history up to it, so greedy output equals mlx-lm's plain
decoding with the same processors and sampled output keeps their distribution,
alone and batched."""

import mlx.core as mx
import mlx_lm
import numpy as np
import pytest
from chisquare import chi2, chi2_critical
from lossless import oracle, plain
from oracles import RowOracleDraft
from test_batch import CloseRows, _pair, _run, _start
from test_sampling import CloseDraft

from dflash_mlx import SamplingParams, load, load_draft, stream_generate
from dflash_mlx.engine.batch import Batch, Request
from dflash_mlx.engine.processors import Processors

N = 24
TEXTS = ["hello world, this is a test", "1, 2, 3, 4,", "The quick brown fox", "abc"]


def penalties():
    """Every mlx-lm processor the server maps a client's knobs to, strong enough to
    change greedy output on the tiny models."""
    from mlx_lm.sample_utils import make_logits_processors

    return make_logits_processors(
        logit_bias={5: 2.0, 70: -3.0},
        repetition_penalty=1.6,
        presence_penalty=0.7,
        frequency_penalty=0.5,
    )


def processed_plain(model, tok, ids, n, processors):
    """mlx-lm's greedy tokens with `processors`: the reference."""
    steps = mlx_lm.stream_generate(
        model, tok, ids, max_tokens=n, logits_processors=processors
    )
    return [r.token for r in steps]


class Recorder:
    """A processor that changes nothing and records each history it is shown."""

    def __init__(self):
        self.seen: list[list[int]] = []

    def __call__(self, tokens, logits):
        self.seen.append(tokens.tolist())
        return logits


@pytest.mark.parametrize("family", ["qwen3", "qwen3_5"])
@pytest.mark.parametrize("block_size", [2, 4, "auto"])
def test_greedy_processed_equals_plain_decoding(tiny_pair, family, block_size):
    """An oracle proposes mlx-lm's processed output, wrong now and then: every block
    position must see its own history for the drafts to be accepted and the output
    to equal the reference (which the penalties changed)."""
    t, d = tiny_pair(family)
    model, tok = load(str(t))
    draft = load_draft(str(d), target=model)
    for text in TEXTS[:3]:
        ids = tok.encode(text)
        expected = processed_plain(model, tok, ids, N, penalties())
        assert expected != plain(model, tok, ids, N)  # the processors matter
        o = oracle(draft, ids + expected, wrong=lambda k, i: i % 5 == 3)
        responses = list(
            stream_generate(
                model, o, tok, ids, block_size=block_size, max_tokens=N,
                logits_processors=penalties(),
            )
        )  # fmt: skip
        got = [t for r in responses for t in r.tokens]
        assert got == expected, text
        if block_size != "auto":  # drafts were accepted
            assert sum(r.from_draft for r in responses) > N // 3


def test_each_position_sees_the_drafts_before_it(tiny_pair):
    """The processor at block position i is shown the prompt, the committed tokens,
    `last` and the i drafts before it; after a rejection, the next block's history is
    the committed one again."""
    t, d = tiny_pair("qwen3")
    model, tok = load(str(t))
    draft = load_draft(str(d), target=model)
    ids = tok.encode(TEXTS[0])
    expected = plain(model, tok, ids, 12)
    o = oracle(draft, ids + expected, wrong=lambda k, i: k == 3)
    recorder = Recorder()
    responses = stream_generate(
        model, o, tok, ids, block_size=4, max_tokens=12, logits_processors=[recorder]
    )
    got = [t for r in responses for t in r.tokens]
    assert got == expected
    full = ids + expected
    assert recorder.seen[0] == ids  # the first token's: the prompt
    for seen in recorder.seen[1:]:
        # the committed history, then the drafts: the oracle's are the reference's
        # but the third of a block (only ever the last one shown), which is wrong
        assert seen[:-1] == full[: len(seen) - 1]
    lengths = [len(s) for s in recorder.seen[1:]]
    assert lengths[:4] == [len(ids) + 1 + i for i in range(4)]  # one block of 4
    assert lengths[4] == len(ids) + 4  # two drafts accepted, one token of its own


def test_processors_of():
    assert Processors.of(None) is None and Processors.of([]) is None
    with pytest.raises(ValueError, match="list of callables"):
        Processors.of([1])
    p = Processors.of(lambda tokens, logits: logits)
    assert p is not None and p.history([1, 2], 3).tolist() == [1, 2, 3]
    assert p.history([1, 2, 3], 4).tolist() == [1, 2, 3, 4]
    assert p.history([7], None).tolist() == [7]  # another history: rebuilt


@pytest.mark.parametrize("family", ["qwen3", "qwen3_5"])
def test_batched_greedy_processed_equals_plain_decoding(tiny_pair, family):
    """Four sequences with processors (two with, two without) joining and leaving a
    batch: each equals mlx-lm's plain decoding with its own processors."""
    target, base, model, tok = _pair(tiny_pair, family)
    o = RowOracleDraft(base.args, wrong=lambda k, i: (i // 3) % 3 == 2)
    o.update(base.parameters())
    o.use_kernels(target.kernels)
    prompts = [tok.encode(t) for t in TEXTS]
    stops = frozenset(tok.eos_token_ids)
    with_processors = [i % 2 == 0 for i in range(4)]
    expected = [
        processed_plain(model, tok, ids, N, penalties() if on else None)
        for ids, on in zip(prompts, with_processors, strict=True)
    ]
    batch = Batch(target, o, 4)
    o.batch = batch
    requests = [
        Request(
            max_tokens=N,
            stop_tokens=stops,
            logits_processors=tuple(penalties()) if on else (),
        )
        for on in with_processors
    ]
    got = _run(batch, target, o, prompts, requests, [0, 0, 2, 5], expected)
    assert got == expected


def _bias_and_presence():
    """A logit bias, a presence penalty, and a boost of a token the one before picks:
    a row processed with the wrong history has another distribution."""
    from mlx_lm.sample_utils import make_logits_processors

    def follow(tokens, logits):
        return logits.at[:, (tokens[-1:] * 7 + 3) % logits.shape[-1]].add(6.0)

    processors = make_logits_processors(logit_bias={5: 1.5}, presence_penalty=0.5)
    return [*processors, follow]


def test_sampled_processed_generation_has_the_processed_distribution(tiny_pair):
    """3-token samples (the last two verified in one block, the drafter's proposals
    accepted or not) follow the processed target distribution (chi-square)."""
    t, d = tiny_pair("qwen3_5")
    model, tok = load(str(t))
    tok.eos_token_ids = set()
    draft = load_draft(str(d))
    prompt = tok.encode("The quick brown fox")
    params = SamplingParams(temperature=1.0, top_k=3)
    close = CloseDraft(draft.args, model, prompt)
    close.update(draft.parameters())
    procs = _bias_and_presence()

    def probs(prefix):
        logits = model(mx.array([prefix]))[0, -1:]
        for p in procs:
            logits = p(mx.array(prefix), logits)
        return np.array(params.probs(logits[0]))

    exact = {}
    p1 = probs(prompt)
    for a in np.flatnonzero(p1):
        p2 = probs(prompt + [int(a)])
        for b in np.flatnonzero(p2):
            p3 = probs(prompt + [int(a), int(b)])
            for c in np.flatnonzero(p3):
                exact[(int(a), int(b), int(c))] = p1[a] * p2[b] * p3[c]
    outcomes = list(exact)
    mx.random.seed(5)
    counts, accepted = np.zeros(len(outcomes)), 0
    for _ in range(1000):
        responses = list(
            stream_generate(
                model, close, tok, prompt, block_size=3, max_tokens=3,
                temperature=1.0, top_k=3, logits_processors=procs,
            )
        )  # fmt: skip
        counts[outcomes.index(tuple(t for r in responses for t in r.tokens))] += 1
        accepted += responses[1].from_draft
    stat, dof = chi2(counts, [exact[o] for o in outcomes])
    assert stat < chi2_critical(dof), stat
    assert 100 < accepted < 900


def test_batched_sampled_processed_generation_has_the_processed_distribution(
    tiny_pair,
):
    """Rejection sampling row by row in a batch of 4, each row with processors: the
    2-token outcomes follow the processed distribution."""
    target, draft, model, tok = _pair(tiny_pair, "qwen3")
    prompt = tok.encode("The quick brown fox")
    params = SamplingParams(temperature=1.0, top_k=3)
    close = CloseRows(draft.args, model, prompt)
    close.update(draft.parameters())
    close.use_kernels(target.kernels)
    procs = _bias_and_presence()

    def probs(prefix):
        logits = model(mx.array([prefix]))[0, -1:]
        for p in procs:
            logits = p(mx.array(prefix), logits)
        return np.array(params.probs(logits[0]))

    exact = {}
    p1 = probs(prompt)
    for a in np.flatnonzero(p1):
        p2 = probs(prompt + [int(a)])
        for b in np.flatnonzero(p2):
            exact[(int(a), int(b))] = p1[a] * p2[b]
    outcomes = list(exact)
    counts, accepted = np.zeros(len(outcomes)), 0
    mx.random.seed(4)
    request = Request(params, 3, frozenset(), logits_processors=tuple(procs))
    for _ in range(300):
        batch = Batch(target, close, 2)
        members = [_start(batch, target, close, prompt, request) for _ in range(4)]
        firsts = {m: t for m, t in members}
        for member, block in batch.step():
            counts[outcomes.index((firsts[member], block.tokens[0]))] += 1
            accepted += block.from_draft
    stat, dof = chi2(counts, [exact[o] for o in outcomes])
    assert stat < chi2_critical(dof), stat
    assert 100 < accepted < 1100
