"""Acceptance rules: greedy prefix match, and lossless speculative sampling (statistically)."""

import math

import mlx.core as mx
import numpy as np
import pytest

from dflash_mlx.verify import SamplingParams, accept_greedy, accept_sampled


def chi2_critical(dof, z=3.09):
    """Wilson-Hilferty approximation of the chi-square quantile (z=3.09: p = 0.001)."""
    return dof * (1 - 2 / (9 * dof) + z * math.sqrt(2 / (9 * dof))) ** 3


def chi2(counts, probs):
    counts, probs = np.asarray(counts, float), np.asarray(probs, float)
    keep = probs > 0
    assert counts[~keep].sum() == 0, "a token with zero probability was produced"
    n = counts.sum()
    stat = ((counts[keep] - n * probs[keep]) ** 2 / (n * probs[keep])).sum()
    return stat, keep.sum() - 1


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


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(temperature=-1),
        dict(top_p=0),
        dict(top_p=1.5),
        dict(top_k=-2),
        dict(min_p=1.0),
    ],
)
def test_bad_sampling_params(kwargs):
    with pytest.raises(ValueError):
        SamplingParams(**kwargs)
