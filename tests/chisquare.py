"""Chi-square goodness of fit, for the tests that check a sampling distribution."""

import math

import numpy as np


def chi2_critical(dof, z=3.09):
    """Wilson-Hilferty approximation of the chi-square quantile (z=3.09: p = 0.001)."""
    return dof * (1 - 2 / (9 * dof) + z * math.sqrt(2 / (9 * dof))) ** 3


def chi2(counts, probs, least=5.0):
    """(statistic, degrees of freedom) of `counts` against `probs`; a count where the
    probability is 0 fails at once. Outcomes expected fewer than `least` times are
    pooled into one (the statistic's chi-square law needs a few per cell: one rare
    hit in a cell expected 0.1 times would otherwise fail an exact sampler)."""
    counts, probs = np.asarray(counts, float), np.asarray(probs, float)
    keep = probs > 0
    assert counts[~keep].sum() == 0, "a token with zero probability was produced"
    counts, probs = counts[keep], probs[keep]
    n = counts.sum()
    rare = n * probs < least
    if rare.any():
        counts = np.append(counts[~rare], counts[rare].sum())
        probs = np.append(probs[~rare], probs[rare].sum())
    stat = ((counts - n * probs) ** 2 / (n * probs)).sum()
    return stat, len(counts) - 1
