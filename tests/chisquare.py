"""Chi-square goodness of fit, for the tests that check a sampling distribution."""

import math

import numpy as np


def chi2_critical(dof, z=3.09):
    """Wilson-Hilferty approximation of the chi-square quantile (z=3.09: p = 0.001)."""
    return dof * (1 - 2 / (9 * dof) + z * math.sqrt(2 / (9 * dof))) ** 3


def chi2(counts, probs):
    """(statistic, degrees of freedom) of `counts` against `probs`; a count where the
    probability is 0 fails at once."""
    counts, probs = np.asarray(counts, float), np.asarray(probs, float)
    keep = probs > 0
    assert counts[~keep].sum() == 0, "a token with zero probability was produced"
    n = counts.sum()
    stat = ((counts[keep] - n * probs[keep]) ** 2 / (n * probs[keep])).sum()
    return stat, keep.sum() - 1
