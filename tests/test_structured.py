"""Grammars as logits processors (dflash_mlx/structured.py) under speculation: greedy
output equals plain constrained decoding token for token, sampled output keeps the
constrained distribution, alone and batched; bad grammars and dead ends."""

import json

import mlx.core as mx
import mlx_lm
import numpy as np
import pytest
from chisquare import chi2, chi2_critical
from lossless import oracle
from oracles import RowOracleDraft
from test_batch import CloseRows, _pair, _run, _start
from test_sampling import CloseDraft

from dflash_mlx import SamplingParams, load, load_draft, stream_generate
from dflash_mlx.engine.batch import Batch, Request
from dflash_mlx.engine.loop import as_target
from dflash_mlx.structured import (
    DEAD_END,
    GrammarProcessor,
    Grammars,
    GrammarSpec,
)

TEXTS = ["hello world, this is a test", "1, 2, 3, 4,", "The quick brown fox", "abc"]
SCHEMA = {
    "type": "object",
    "properties": {
        "answer": {"enum": ["yes", "no", "maybe"]},
        "n": {"type": "integer", "minimum": 0, "maximum": 99},
    },
    "required": ["answer", "n"],
    "additionalProperties": False,
}


def constrained_plain(model, tok, ids, n, grammars, spec):
    """mlx-lm's greedy tokens under the grammar: the reference."""
    steps = mlx_lm.stream_generate(
        model, tok, ids, max_tokens=n, logits_processors=[grammars.processor(spec)]
    )
    return [r.token for r in steps]


@pytest.mark.parametrize("family", ["qwen3", "qwen3_5"])
@pytest.mark.parametrize("block_size", [2, 4, "auto"])
def test_greedy_constrained_equals_plain_constrained(tiny_pair, family, block_size):
    """Drafts from the real (random) drafter, mostly outside the grammar, and from an
    oracle of the constrained answer, wrong now and then: DFlash's tokens are plain
    constrained decoding's, and the answer is valid against the schema."""
    t, d = tiny_pair(family)
    model, tok = load(str(t))
    draft = load_draft(str(d), target=model)
    grammars = Grammars(tok, as_target(model, None).vocab_size)
    spec = GrammarSpec.json_schema(SCHEMA)
    for text in TEXTS[:2]:
        ids = tok.encode(text)
        expected = constrained_plain(model, tok, ids, 40, grammars, spec)
        assert expected[-1] in tok.eos_token_ids  # the grammar ended the answer
        answer = json.loads(tok.decode(expected[:-1]))
        assert answer["answer"] in SCHEMA["properties"]["answer"]["enum"]
        o = oracle(draft, ids + expected, wrong=lambda k, i: i % 4 == 1)
        for proposer in (draft, o):
            responses = list(
                stream_generate(
                    model, proposer, tok, ids, block_size=block_size, max_tokens=40,
                    logits_processors=[grammars.processor(spec)],
                )
            )  # fmt: skip
            assert [t for r in responses for t in r.tokens] == expected, text
            assert responses[-1].finish_reason == "stop"
        if block_size == 4:  # the oracle's drafts were accepted
            assert sum(r.from_draft for r in responses) > len(expected) // 3
        copied = stream_generate(
            model, draft, tok, ids, block_size=block_size, max_tokens=40, lookup=True,
            logits_processors=[grammars.processor(spec)],
        )  # fmt: skip
        assert [t for r in copied for t in r.tokens] == expected  # prompt lookup too


def test_batched_greedy_constrained_equals_plain_constrained(tiny_pair):
    """Constrained and free sequences in one batch, joining and leaving."""
    target, base, model, tok = _pair(tiny_pair, "qwen3")
    o = RowOracleDraft(base.args, wrong=lambda k, i: (i // 3) % 3 == 2)
    o.update(base.parameters())
    o.use_kernels(target.kernels)
    grammars = Grammars(tok, as_target(model, None).vocab_size)
    spec = GrammarSpec.json_schema(SCHEMA)
    prompts = [tok.encode(t) for t in TEXTS]
    constrained = [True, False, True, True]
    expected = [
        constrained_plain(model, tok, ids, 30, grammars, spec)
        if on
        else [r.token for r in mlx_lm.stream_generate(model, tok, ids, max_tokens=30)]
        for ids, on in zip(prompts, constrained, strict=True)
    ]
    batch = Batch(target, o, 4)
    o.batch = batch
    stops = frozenset(tok.eos_token_ids)
    requests = [
        Request(
            max_tokens=30,
            stop_tokens=stops,
            logits_processors=(grammars.processor(spec),) if on else (),
        )
        for on in constrained
    ]
    got = _run(batch, target, o, prompts, requests, [0, 0, 2, 5], expected)
    assert got == expected


def _abc(tok):
    """Three letters from {a, b, c}: each position's allowed tokens are known."""
    letters = [tok.encode(c)[0] for c in "abc"]
    return GrammarSpec("regex", "[abc]{3}"), letters


def _constrained_probs(model, params, letters):
    def probs(prefix):
        logits = model(mx.array([prefix]))[0, -1]
        allowed = mx.zeros(logits.shape, mx.bool_).at[mx.array(letters)].add(True)
        masked = mx.where(allowed, logits, -mx.inf)
        return np.array(params.probs(masked))

    return probs


def test_sampled_constrained_generation_has_the_constrained_distribution(tiny_pair):
    """Three sampled letters (the last two verified in one block of drafts the grammar
    may forbid) follow the masked target distribution (chi-square)."""
    t, d = tiny_pair("qwen3_5")
    model, tok = load(str(t))
    draft = load_draft(str(d))
    grammars = Grammars(tok, as_target(model, None).vocab_size)
    prompt = tok.encode("The quick brown fox")
    spec, letters = _abc(tok)
    params = SamplingParams(temperature=1.0)
    close = CloseDraft(draft.args, model, prompt)
    close.update(draft.parameters())
    probs = _constrained_probs(model, params, letters)
    exact = {}
    p1 = probs(prompt)
    for a in letters:
        p2 = probs(prompt + [a])
        for b in letters:
            p3 = probs(prompt + [a, b])
            for c in letters:
                exact[(a, b, c)] = p1[a] * p2[b] * p3[c]
    outcomes = list(exact)
    mx.random.seed(9)
    counts = np.zeros(len(outcomes))
    for _ in range(600):
        responses = stream_generate(
            model, close, tok, prompt, block_size=3, max_tokens=3, temperature=1.0,
            logits_processors=[grammars.processor(spec)],
        )  # fmt: skip
        counts[outcomes.index(tuple(t for r in responses for t in r.tokens))] += 1
    stat, dof = chi2(counts, [exact[o] for o in outcomes])
    assert stat < chi2_critical(dof), stat


def test_batched_sampled_constrained_has_the_constrained_distribution(tiny_pair):
    target, draft, model, tok = _pair(tiny_pair, "qwen3")
    grammars = Grammars(tok, as_target(model, None).vocab_size)
    prompt = tok.encode("The quick brown fox")
    spec, letters = _abc(tok)
    params = SamplingParams(temperature=1.0)
    close = CloseRows(draft.args, model, prompt)
    close.update(draft.parameters())
    close.use_kernels(target.kernels)
    probs = _constrained_probs(model, params, letters)
    exact = {}
    p1 = probs(prompt)
    for a in letters:
        p2 = probs(prompt + [a])
        for b in letters:
            exact[(a, b)] = p1[a] * p2[b]
    outcomes = list(exact)
    counts = np.zeros(len(outcomes))
    mx.random.seed(2)
    for _ in range(150):
        batch = Batch(target, close, 2)
        members = []
        for _ in range(4):
            request = Request(
                params, 3, frozenset(), logits_processors=(grammars.processor(spec),)
            )
            members.append(_start(batch, target, close, prompt, request))
        firsts = {m: t for m, t in members}
        for member, block in batch.step():
            counts[outcomes.index((firsts[member], block.tokens[0]))] += 1
    stat, dof = chi2(counts, [exact[o] for o in outcomes])
    assert stat < chi2_critical(dof), stat


def test_a_bad_schema_is_a_value_error_naming_it(tiny_pair):
    t, _ = tiny_pair("qwen3")
    model, tok = load(str(t))
    grammars = Grammars(tok, as_target(model, None).vocab_size)
    with pytest.raises(ValueError, match="JSON schema is not valid"):
        grammars.processor(GrammarSpec.json_schema({"type": "no-such-type"}))
    with pytest.raises(ValueError, match="not valid JSON"):
        GrammarSpec.json_schema("{nope")
    with pytest.raises(ValueError, match="grammar is not valid"):
        grammars.processor(GrammarSpec("lark", "start: undefined_rule"))


class DeadMatcher:
    """A matcher that allows nothing at all (an all-zero mask)."""

    def __init__(self, vocab):
        self.vocab = vocab

    def is_error(self):
        return False

    def compute_bitmask(self):
        return bytes((self.vocab + 31) // 32 * 4)

    def validate_tokens(self, tokens):
        return len(tokens)

    def consume_tokens(self, tokens):
        return True

    def rollback(self, n):
        return True


def test_a_dead_end_stops_the_answer_with_its_finish_reason(tiny_pair):
    """A grammar with no token left ends the answer at once on a stop token, with
    finish_reason "grammar" (never a run of masked garbage, never a hang)."""
    t, d = tiny_pair("qwen3")
    model, tok = load(str(t))
    draft = load_draft(str(d), target=model)
    vocab = as_target(model, None).vocab_size
    eos = tuple(sorted(tok.eos_token_ids))
    for temperature in (0.0, 1.0):
        processor = GrammarProcessor(DeadMatcher(vocab), eos, vocab)
        responses = list(
            stream_generate(
                model, draft, tok, "hello", max_tokens=20, block_size=4,
                temperature=temperature, logits_processors=[processor],
            )
        )  # fmt: skip
        assert [t for r in responses for t in r.tokens] == [eos[0]]
        assert responses[-1].finish_reason == DEAD_END and processor.dead_end


def test_the_grammar_proposes_what_it_forces_and_leaves_its_matcher_as_it_was(
    tiny_pair,
):
    """After [abc], "xyz" is forced: those drafts become x, y, z whatever the drafter
    said; a free draft the grammar allows stays, the first it forbids ends the chosen
    ones; the matcher is back where it was (the next mask is a fresh processor's)."""
    t, _ = tiny_pair("qwen3")
    model, tok = load(str(t))
    grammars = Grammars(tok, as_target(model, None).vocab_size)
    spec = GrammarSpec("regex", "[abc]xyz[abc]")
    a, b, x, y, z, q = (tok.encode(c)[0] for c in "abxyzq")
    prompt = tok.encode("The quick brown fox")
    logits = mx.zeros((1, grammars.vocab_size))
    processor = grammars.processor(spec)
    processor(mx.array(prompt), logits)  # the prefill's call: the prompt's length
    after, chosen = processor.propose(prompt, a, [q, q, q, b, q, q])
    assert after == [x, y, z, b, q, q]
    assert chosen == [True, True, True, False]  # then q, past the end: forbidden
    fresh = grammars.processor(spec)
    fresh(mx.array(prompt), logits)
    history = mx.array([*prompt, a, x])
    assert mx.array_equal(processor(history, logits), fresh(history, logits))


def test_forced_tokens_are_accepted_in_blocks_with_a_drafter_that_knows_none(
    tiny_pair,
):
    """A long forced key: the random drafter proposes none of it, the grammar does,
    so blocks commit several tokens; the output is still plain constrained decoding's,
    alone and with prompt lookup."""
    t, d = tiny_pair("qwen3")
    model, tok = load(str(t))
    draft = load_draft(str(d), target=model)
    grammars = Grammars(tok, as_target(model, None).vocab_size)
    schema = {
        "type": "object",
        "properties": {"the_answer_to_the_question": {"type": "integer"}},
        "required": ["the_answer_to_the_question"],
        "additionalProperties": False,
    }
    spec = GrammarSpec.json_schema(schema)
    ids = tok.encode("hello world")
    expected = constrained_plain(model, tok, ids, 40, grammars, spec)
    for lookup in (False, True):
        responses = list(
            stream_generate(
                model, draft, tok, ids, block_size=8, max_tokens=40, lookup=lookup,
                logits_processors=[grammars.processor(spec)],
            )
        )  # fmt: skip
        assert [t for r in responses for t in r.tokens] == expected
        assert sum(r.from_draft for r in responses) >= 20  # the key's 29 bytes


def test_sampled_blocks_with_forced_tokens_keep_the_constrained_distribution(
    tiny_pair,
):
    """[abc]xyz[abc] sampled in two blocks: the drafter's sampled drafts at x, y, z are
    replaced (q one-hot there) and the last letter is its own sampled draft; the two
    letters follow the masked target distribution (chi-square)."""
    t, d = tiny_pair("qwen3_5")
    model, tok = load(str(t))
    draft = load_draft(str(d))
    grammars = Grammars(tok, as_target(model, None).vocab_size)
    prompt = tok.encode("The quick brown fox")
    spec = GrammarSpec("regex", "[abc]xyz[abc]")
    letters = [tok.encode(c)[0] for c in "abc"]
    forced = tok.encode("xyz")
    params = SamplingParams(temperature=1.0)
    close = CloseDraft(draft.args, model, prompt)
    close.update(draft.parameters())
    probs = _constrained_probs(model, params, letters)
    p1 = probs(prompt)
    exact = {
        (a, c): p1[a] * probs(prompt + [a, *forced])[c]
        for a in letters
        for c in letters
    }
    outcomes = list(exact)
    mx.random.seed(5)
    counts = np.zeros(len(outcomes))
    for _ in range(500):
        responses = stream_generate(
            model, close, tok, prompt, block_size=5, max_tokens=5, temperature=1.0,
            logits_processors=[grammars.processor(spec)],
        )  # fmt: skip
        tokens = [t for r in responses for t in r.tokens]
        assert tokens[1:4] == forced
        counts[outcomes.index((tokens[0], tokens[4]))] += 1
    stat, dof = chi2(counts, [exact[o] for o in outcomes])
    assert stat < chi2_critical(dof), stat
