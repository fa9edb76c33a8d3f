"""Acceptance rules: greedy prefix match, lossless speculative sampling (statistics)."""

import mlx.core as mx
import numpy as np
import pytest
from chisquare import chi2, chi2_critical

from dflash_mlx.engine.verify import accept_greedy, accept_sampled
from dflash_mlx.sampling import SamplingParams


def test_greedy_prefix():
    logits = mx.eye(6)[mx.array([2, 4, 1, 5])] * 10  # target argmax: 2, 4, 1, 5
    n, emitted = accept_greedy(mx.array([2, 4, 0]), logits)
    assert n.item() == 2 and emitted[:3].tolist() == [2, 4, 1]
    n, emitted = accept_greedy(mx.array([2, 4, 1]), logits)
    assert n.item() == 3 and emitted.tolist() == [2, 4, 1, 5]
    n, emitted = accept_greedy(mx.array([3, 4, 1]), logits)
    assert n.item() == 0 and emitted[0].item() == 2


def _biased(drafts_unused, draft_probs, target_probs):
    """The known-wrong variant: argmax drafts scored with the softmax q."""
    drafts = mx.argmax(draft_probs, axis=-1)
    return accept_sampled(drafts, draft_probs, target_probs)


def _run(rule, p, q, trials, sample_drafts=True):
    """Empirical distribution of the first two committed tokens."""
    mx.random.seed(1234)
    V = p.shape[-1]
    first = np.zeros(V)
    second = np.zeros(V)
    for _ in range(trials):
        drafts = mx.random.categorical(mx.log(q))
        n, emitted = rule(drafts, q, p)
        n, emitted = n.item(), emitted.tolist()
        first[emitted[0]] += 1
        if n >= 1:
            second[emitted[1]] += 1
    return first, second


P = np.array(
    [
        [0.50, 0.20, 0.15, 0.10, 0.05, 0.00],
        [0.05, 0.05, 0.60, 0.10, 0.10, 0.10],
        [0.30, 0.30, 0.10, 0.10, 0.10, 0.10],
    ],
    np.float32,
)
Q = np.array(
    [[0.10, 0.40, 0.10, 0.20, 0.10, 0.10], [0.05, 0.05, 0.30, 0.30, 0.20, 0.10]],
    np.float32,
)


def test_speculative_sampling_keeps_the_target_distribution():
    first, second = _run(accept_sampled, mx.array(P), mx.array(Q), 6000)
    for counts, row in [(first, P[0]), (second, P[1])]:
        stat, dof = chi2(counts, row)
        assert stat < chi2_critical(dof), (stat, counts)


def test_the_check_catches_the_biased_variant():
    first, _ = _run(_biased, mx.array(P), mx.array(Q), 6000)
    stat, dof = chi2(first, P[0]) if first[5] == 0 else (float("inf"), 1)
    assert stat > chi2_critical(dof) * 3


def test_sampling_transform():
    logits = mx.log(mx.array([[0.5, 0.25, 0.15, 0.1]]))
    probs = SamplingParams(temperature=1.0, top_k=2).probs(logits)
    assert np.allclose(np.array(probs), [[2 / 3, 1 / 3, 0, 0]], atol=1e-6)
    probs = SamplingParams(temperature=1.0, top_p=0.7).probs(logits)
    assert np.allclose(np.array(probs), [[2 / 3, 1 / 3, 0, 0]], atol=1e-6)
    probs = SamplingParams(temperature=1.0, min_p=0.4).probs(logits)
    assert np.allclose(np.array(probs), [[2 / 3, 1 / 3, 0, 0]], atol=1e-6)
    probs = SamplingParams(temperature=2.0).probs(logits)
    expected = np.sqrt([0.5, 0.25, 0.15, 0.1])
    assert np.allclose(np.array(probs), [expected / expected.sum()], atol=1e-6)


def test_filters_come_before_the_temperature():
    """As in mlx-lm: top-p picks its tokens at temperature 1 (at temperature 2 first,
    three tokens would reach 0.7), then the temperature reshapes what is left."""
    logits = mx.log(mx.array([0.5, 0.25, 0.15, 0.1]))
    probs = SamplingParams(temperature=2.0, top_p=0.7).probs(logits)
    kept = np.sqrt([0.5, 0.25])
    assert np.allclose(np.array(probs), [*(kept / kept.sum()), 0, 0], atol=1e-6)


def test_zero_turns_each_filter_off():
    logits = mx.log(mx.array([0.5, 0.25, 0.15, 0.1]))
    full = np.array(SamplingParams(temperature=0.8).probs(logits))
    for off in (dict(top_p=0.0), dict(top_p=1.0), dict(top_k=0), dict(top_k=4)):
        got = SamplingParams(temperature=0.8, min_p=0.0, **off).probs(logits)
        assert np.allclose(np.array(got), full, atol=1e-6), off
    assert (full > 0).all()


# Logits with no ties, so every filter keeps a well-defined set of tokens.
LOGITS = np.array([2.1, -0.3, 1.4, 0.2, -1.7, 0.9, -0.8, 1.1, -2.5, 0.5, -0.1, 1.8])
MAKE_SAMPLER_CASES = [
    dict(temp=0.7, top_p=0.8),
    dict(temp=1.5, min_p=0.1),
    dict(temp=0.8, top_k=4),
    dict(temp=1.3, top_p=0.9, min_p=0.05, top_k=5),
    dict(temp=2.0, top_p=0.6, top_k=3),
    dict(temp=1.0, top_p=0.0, min_p=0.0, top_k=0),
]


def _ours(case):
    return SamplingParams(
        temperature=case["temp"],
        top_p=case.get("top_p", 1.0),
        top_k=case.get("top_k", 0),
        min_p=case.get("min_p", 0.0),
    )


@pytest.mark.parametrize("case", MAKE_SAMPLER_CASES)
def test_distribution_equals_mlx_lm_make_sampler(case):
    """mlx-lm's sampler, drawn many times on the same logits, has our distribution."""
    from mlx_lm.sample_utils import make_sampler

    logits = mx.array(LOGITS, mx.float32)
    probs = np.array(_ours(case).probs(logits[None])[0])
    n = 60_000
    logprobs = logits - mx.logsumexp(logits)
    mx.random.seed(5)
    draws = make_sampler(**case)(mx.broadcast_to(logprobs, (n, LOGITS.size)))
    counts = np.bincount(np.array(draws), minlength=LOGITS.size)
    stat, dof = chi2(counts, probs)
    assert stat < chi2_critical(dof), (stat, counts, probs)
    # the same tokens survive: every token we keep shows up in mlx-lm's draws
    assert set(np.flatnonzero(counts)) == set(np.flatnonzero(probs > 0))


@pytest.mark.parametrize("case", [dict(temp=2.0, top_p=0.6), dict(temp=2.0, min_p=0.2)])
def test_the_comparison_catches_the_old_order(case):
    """Temperature applied before the filters (this package's old transform) keeps
    tokens that mlx-lm's sampler never draws: the check above tells them apart."""
    from mlx_lm.sample_utils import make_sampler

    logits = mx.array(LOGITS, mx.float32)
    old = _ours({**case, "temp": 1.0}).probs(logits[None] / case["temp"])[0]
    mx.random.seed(5)
    logprobs = logits - mx.logsumexp(logits)
    draws = make_sampler(**case)(mx.broadcast_to(logprobs, (60_000, LOGITS.size)))
    counts = np.bincount(np.array(draws), minlength=LOGITS.size)
    stat, dof = chi2(counts, np.array(old))
    assert stat > 10 * chi2_critical(dof)


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(temperature=-1),
        dict(top_p=-0.1),
        dict(top_p=1.5),
        dict(top_k=-2),
        dict(min_p=-0.1),
        dict(min_p=1.5),
    ],
)
def test_bad_sampling_params(kwargs):
    with pytest.raises(ValueError):
        SamplingParams(**kwargs)
