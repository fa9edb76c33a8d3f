"""Prompt lookup in the engine: greedy output equals plain decoding with copies and
splices verified, sampling keeps the target's distribution (a copy is a deterministic
draft), seeded runs give the same tokens with and without lookup, and without a match
the engine asks the policy exactly what it asked before."""

import mlx.core as mx
import numpy as np
import pytest
from chisquare import chi2, chi2_critical
from lossless import PROMPTS, plain

from dflash_mlx import SamplingParams, load, load_draft, stream_generate
from dflash_mlx.engine.lookup import LookupIndex
from dflash_mlx.engine.sources import DRAFT, LOOKUP, SPLICE, Plan
from dflash_mlx.engine.verify import accept_lookup, accept_sampled, one_hot

REPEATS = [PROMPTS[0], "abc abc abc abc", "def f(x):\n    return x\ndef g(x):\n    "]
POLICIES = ["lookup", "right", "partly right", "splice", "fixed", "auto", "no drafter"]
# the hybrid and sliding-window targets roll back long copies: the copying policies
CASES = [("qwen3", p) for p in POLICIES + ["2-gram"]] + [
    (f, p) for f in ("qwen3_5", "gemma4_text") for p in POLICIES[1:4]
]


class Forced:
    """A policy that verifies every copy it is offered, alone (`LOOKUP`) or in front
    of the drafter's drafts (`SPLICE`, at most `copied` of it); the drafter's `size`
    block without one."""

    def __init__(self, source: int, size: int = 8, copied: int = 15):
        self.source, self.size, self.copied = source, size, copied
        self.asked: list[str] = []  # "next" or "plan", in order
        self.seen: list = []  # each observed block's source (DRAFT if not given)

    def next(self, limit=None):
        self.asked.append("next")
        return max(1, min(self.size, limit or self.size))

    def plan(self, limit, copied, match=0, drafter=True):
        self.asked.append("plan")
        size = min(self.size, limit)
        k = min(copied, size - 1, self.copied)
        if k < 1:
            return Plan(DRAFT, size)
        if self.source == LOOKUP or not drafter or k + 1 >= size:
            return Plan(LOOKUP, 1 + k, k)
        return Plan(SPLICE, size, k)

    def observe(self, size, n_accepted, seconds, **measured):
        self.seen.append(measured.get("source", DRAFT))


class GreedyCopies(LookupIndex):
    """Copies the target's own greedy continuation of the history: a deterministic
    proposal that is often right under sampling (the real index's copies rarely are
    on a random tiny model), to exercise acceptance as well as rejection."""

    def __init__(self, model, wrong_at: int = 0):
        super().__init__()
        self.model, self.wrong_at = model, wrong_at  # wrong_at k: id k is off by one

    def propose(self, limit):
        out, history = [], list(self.tokens)
        for _ in range(limit):
            logits = self.model(mx.array([history]))[0, -1]
            out.append(int(mx.argmax(logits).item()))
            history.append(out[-1])
        if 0 < self.wrong_at <= len(out):
            out[self.wrong_at - 1] = (out[self.wrong_at - 1] + 1) % 256
        self.match = 4
        return out


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


@pytest.fixture(scope="module")
def reference(loaded):
    """Plain mlx-lm greedy tokens per (family, prompt), computed once."""
    refs: dict = {}

    def get(family, text):
        if (family, text) not in refs:
            model, tok, _ = loaded(family)
            refs[family, text] = plain(model, tok, tok.encode(text), 40)
        return refs[family, text]

    return get


def _run(model, draft, tok, prompt, **kw):
    responses = list(stream_generate(model, draft, tok, prompt, **kw))
    return [t for r in responses for t in r.tokens], responses


@pytest.mark.parametrize("family, policy", CASES)
def test_greedy_with_lookup_equals_plain_decoding(loaded, reference, family, policy):
    """Dense, hybrid (GatedDeltaNet rollback over long copies) and sliding-window
    targets; copies alone (the index's, or copies known to be right up to an id),
    spliced, under a fixed size, and as "auto" picks them."""
    model, tok, draft = loaded(family)
    sources, copied = set(), 0
    for text in REPEATS:
        prompt, ref = tok.encode(text), reference(family, text)
        kw: dict = dict(max_tokens=40, lookup=True)
        d = draft
        if policy in ("lookup", "splice"):
            kw["block_size"] = Forced(LOOKUP if policy == "lookup" else SPLICE, 8, 3)
        elif policy == "fixed":
            kw["block_size"] = 4
        elif policy == "auto":
            kw["block_size"] = "auto"
        elif policy == "no drafter":
            d = None
        elif policy in ("right", "partly right"):
            wrong = 0 if policy == "right" else 5
            kw["lookup"] = GreedyCopies(model, wrong_at=wrong)
            kw["block_size"] = Forced(LOOKUP, 12)
        else:
            kw["lookup"] = LookupIndex(min_ngram=2, max_ngram=2)
            kw["block_size"] = Forced(LOOKUP)
        out, responses = _run(model, d, tok, prompt, **kw)
        assert out == ref, (text, policy)
        assert responses[0].source is None
        for r in responses[1:]:
            sources.add(r.source)
            copied += r.from_draft if r.source == "lookup" else 0
            assert (r.source is None) == (r.block_size == 1)
    if policy in ("lookup", "splice", "fixed"):  # a fixed size fills its block
        assert {"splice" if policy == "splice" else "lookup"} <= sources
    if policy in ("right", "partly right"):
        assert copied >= len(REPEATS) * (30 if policy == "right" else 20)


def test_the_index_keeps_the_history_it_was_given(loaded):
    """A caller's index (a chat's, across turns) ends holding the prompt and answer."""
    model, tok, draft = loaded("qwen3")
    index = LookupIndex()
    prompt = tok.encode(REPEATS[0])
    out, _ = _run(model, draft, tok, prompt, max_tokens=20, lookup=index)
    assert index.tokens == prompt + out
    follow_up = prompt + out + tok.encode(" again")
    tables = index._tables
    out2, _ = _run(model, draft, tok, follow_up, max_tokens=10, lookup=index)
    assert index._tables is tables  # extended, not rebuilt
    assert index.tokens == follow_up + out2


def test_without_a_match_the_policy_is_asked_next_as_before(loaded):
    """An index that never matches: the same blocks as without lookup, and `plan` is
    never asked (the copy is looked up in Python before the block; no extra work)."""
    model, tok, draft = loaded("qwen3")
    prompt = tok.encode(REPEATS[0])
    never = LookupIndex(min_ngram=64, max_ngram=64)
    with_index, without = Forced(LOOKUP, 4), Forced(LOOKUP, 4)
    out, responses = _run(
        model, draft, tok, prompt, max_tokens=30, block_size=with_index, lookup=never
    )
    ref, ref_responses = _run(
        model, draft, tok, prompt, max_tokens=30, block_size=without, lookup=False
    )
    assert out == ref
    assert [(r.block_size, r.from_draft) for r in responses] == [
        (r.block_size, r.from_draft) for r in ref_responses
    ]
    assert with_index.asked == without.asked and set(with_index.asked) == {"next"}


def test_lookup_defaults(loaded):
    """On with "auto" and a drafter; off for fixed sizes and plain decoding; refused
    when it is not a flag or an index."""
    from dflash_mlx.engine.policy import AdaptiveBlockSize, FixedBlockSize
    from dflash_mlx.generate import lookup_index

    _, _, draft = loaded("qwen3")
    auto = AdaptiveBlockSize.for_drafter(draft)
    assert isinstance(lookup_index(None, auto, draft), LookupIndex)
    assert lookup_index(None, FixedBlockSize(4), draft) is None
    assert lookup_index(None, AdaptiveBlockSize(1), None) is None
    assert lookup_index(False, auto, draft) is None
    mine = LookupIndex()
    assert lookup_index(mine, FixedBlockSize(4), None) is mine
    model, tok, _ = loaded("qwen3")
    with pytest.raises(ValueError, match="lookup must be True, False, None"):
        list(stream_generate(model, draft, tok, "hi", lookup="yes"))


def _exact3(model, prompt, params):
    """The target's exact distribution of its next three tokens."""

    def probs(prefix):
        return np.array(params.probs(model(mx.array([prefix]))[0, -1]))

    exact = {}
    p1 = probs(prompt)
    for a in np.flatnonzero(p1):
        p2 = probs(prompt + [int(a)])
        for b in np.flatnonzero(p2):
            p3 = probs(prompt + [int(a), int(b)])
            for c in np.flatnonzero(p3):
                exact[(int(a), int(b), int(c))] = p1[a] * p2[b] * p3[c]
    return exact


@pytest.mark.parametrize(
    "source", [pytest.param("lookup", marks=pytest.mark.slow), "splice"]
)
def test_sampled_copies_keep_the_target_distribution(loaded, source):
    """Unseeded rejection sampling: copies accepted with p(d), rejected ones resampled
    from p without d; in a splice the drafter's drafts after the copy keep their q.
    Four tokens are generated (the second block verifies up to 3), the first three
    counted."""
    model, tok, draft = loaded("qwen3")
    tok.eos_token_ids = set()
    prompt = tok.encode("The quick brown fox")
    params = SamplingParams(temperature=1.0, top_k=3)
    exact = _exact3(model, prompt, params)
    outcomes = list(exact)
    mx.random.seed(11)
    counts, accepted = np.zeros(len(outcomes)), 0
    forced = Forced(
        LOOKUP if source == "lookup" else SPLICE, 3, 2 if source == "lookup" else 1
    )
    for _ in range(1500):
        _, responses = _run(
            model, draft, tok, prompt, max_tokens=4, block_size=forced,
            temperature=1.0, top_k=3, lookup=GreedyCopies(model),
        )  # fmt: skip
        seq = tuple(t for r in responses for t in r.tokens)[:3]
        counts[outcomes.index(seq)] += 1
        accepted += responses[1].from_draft
        assert responses[1].source == source
    stat, dof = chi2(counts, [exact[o] for o in outcomes])
    assert stat < chi2_critical(dof), stat
    assert 200 < accepted < 1400  # copies are accepted often, but not always


def test_seeded_runs_give_the_same_tokens_with_and_without_lookup(loaded):
    model, tok, draft = loaded("qwen3")
    prompt = tok.encode(REPEATS[-1])
    kw = dict(max_tokens=30, temperature=0.8, top_p=0.95, seed=5)
    ref, _ = _run(model, draft, tok, prompt, block_size=4, lookup=False, **kw)
    for policy, lookup in [
        (Forced(LOOKUP), True),
        (Forced(SPLICE, 8, 2), True),
        ("auto", True),
        (Forced(LOOKUP), GreedyCopies(model)),
    ]:
        out, responses = _run(
            model, draft, tok, prompt, block_size=policy, lookup=lookup, **kw
        )
        assert out == ref, policy
    assert any(r.source == "lookup" and r.from_draft for r in responses)


# One position's target distribution and a copy d = 0 that it gives 0.6.
P = np.array([[0.6, 0.25, 0.1, 0.05, 0.0], [0.1, 0.2, 0.3, 0.2, 0.2]], np.float32)
TRIALS = 6000


def _first_tokens(rule):
    """Counts of the first committed token over TRIALS blocks, run as one batch."""
    mx.random.seed(99)
    drafts = mx.zeros((TRIALS, 1), mx.int32)
    _, emitted = rule(drafts, mx.broadcast_to(mx.array(P), (TRIALS, *P.shape)))
    return np.bincount(np.array(emitted[:, 0]), minlength=P.shape[1])


def _biased(drafts, target_probs):
    """The known-wrong rule: a copy the target gives more than 1/2 is always taken."""
    p = mx.take_along_axis(target_probs[:, 0], drafts, axis=-1)[:, 0]
    n_accepted, emitted = accept_lookup(drafts, target_probs)
    take = p > 0.5
    first = mx.where(take, drafts[:, 0], emitted[:, 0])
    return mx.where(take, 1, n_accepted), mx.concatenate(
        [first[:, None], emitted[:, 1:]], axis=1
    )


def test_the_lookup_rule_keeps_the_distribution_and_the_check_catches_a_bias():
    stat, dof = chi2(_first_tokens(accept_lookup), P[0])
    assert stat < chi2_critical(dof), stat
    stat, dof = chi2(_first_tokens(_biased), P[0])
    assert stat > chi2_critical(dof) * 3, stat


def test_the_lookup_rule_is_the_sampled_rule_with_a_one_hot_q():
    """A splice scores its copy with `one_hot` q rows in `accept_sampled`: the same
    distribution of the committed token."""
    mx.random.seed(3)
    drafts, probs = mx.array([0]), mx.array(P)
    q = one_hot(drafts, P.shape[1])
    counts = np.zeros(P.shape[1])
    for _ in range(2000):
        counts[accept_sampled(drafts, q, probs)[1][0].item()] += 1
    stat, dof = chi2(counts, P[0])
    assert stat < chi2_critical(dof), stat


def test_the_lookup_rule_runs_on_a_batch_of_blocks():
    """Each row its own block: a copy with p = 0 is never taken, one with p = 1 always,
    and the bonus row is drawn from the row after the copies."""
    mx.random.seed(4)
    probs = mx.array(
        [
            [[0.0, 1.0, 0.0], [0.5, 0.5, 0.0], [0.0, 0.0, 1.0]],
            [[0.0, 1.0, 0.0], [0.0, 0.0, 1.0], [1.0, 0.0, 0.0]],
        ]
    )
    n, emitted = accept_lookup(mx.array([[0, 1], [1, 2]]), probs)
    assert n.tolist() == [0, 2]
    assert emitted[0, 0].item() == 1  # rejected 0: p without it is all on 1
    assert emitted[1].tolist() == [1, 2, 0]  # both taken, the bonus from row 3
