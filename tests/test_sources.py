"""The per-block choice among the drafter, prompt lookup and a splice of both
(engine/sources.py, through `AdaptiveBlockSize.plan`), on a policy with known
timings."""

import pytest

from dflash_mlx.engine.policy import AdaptiveBlockSize, FixedBlockSize
from dflash_mlx.engine.sources import (
    DRAFT,
    LOOKUP,
    SPLICE,
    LookupStats,
    Plan,
    fixed_plan,
    verify_estimate,
)

# a CPU like the demo pair's: verify grows with the tokens, a draft costs ~5 ms more
CPU_BLOCK = {1: 0.030, 2: 0.037, 4: 0.041, 8: 0.052}
CPU_VERIFY = {1: 0.025, 2: 0.027, 4: 0.031, 8: 0.042}


def _policy(alpha: float, block=CPU_BLOCK, verify=CPU_VERIFY) -> AdaptiveBlockSize:
    """A block-8 policy with every size timed and run, the drafter's acceptance
    `alpha` at every position."""
    policy = AdaptiveBlockSize(8, prior=None)
    policy.seconds, policy.verify_seconds = dict(block), dict(verify)
    policy._run = set(policy.sizes)
    policy.prior_accepted = [alpha * 100] * 8
    policy.prior_offered = [100.0] * 8
    return policy


def _copies(policy, match: int, copied: int, accepted: int, blocks: int = 40):
    for _ in range(blocks):
        verify = verify_estimate(policy.verify_seconds, 1 + copied)
        policy.observe(
            1 + copied,
            accepted,
            verify + 0.005,
            verified=1 + copied,
            verify_seconds=verify,
            source=LOOKUP,
            match=match,
            copied=copied,
        )


def test_a_copy_that_is_right_beats_a_weak_drafter():
    policy = _policy(alpha=0.2)
    _copies(policy, match=4, copied=15, accepted=15)
    plan = policy.plan(limit=100, copied=15, match=4)
    assert plan.source == LOOKUP and plan.size == 1 + plan.copied
    assert plan.copied >= 8  # on this CPU a right copy is worth a long verify


def test_a_copy_that_is_always_wrong_leaves_the_drafter_its_block():
    policy = _policy(alpha=0.6)
    _copies(policy, match=1, copied=4, accepted=0)
    plan = policy.plan(limit=100, copied=4, match=1)
    assert plan == Plan(DRAFT, policy.next(limit=100))


def test_longer_matches_are_trusted_more():
    """Counts are kept per match length: copies after 1-gram matches that fail do not
    stop copies after 4-gram matches that succeed."""
    policy = _policy(alpha=0.3)
    _copies(policy, match=1, copied=4, accepted=0)
    _copies(policy, match=4, copied=4, accepted=4)
    assert policy.plan(limit=100, copied=4, match=1).source == DRAFT
    assert policy.plan(limit=100, copied=4, match=4).source == LOOKUP


def test_flat_verify_takes_the_longest_copy():
    """Where verifying more tokens costs nothing more (a GPU), verify it all."""
    flat = {1: 0.020, 16: 0.020}
    policy = _policy(0.5, block={1: 0.022, 2: 0.026, 4: 0.026, 8: 0.026}, verify=flat)
    _copies(policy, match=3, copied=12, accepted=6)
    assert policy.plan(limit=100, copied=12, match=3) == Plan(LOOKUP, 13, 12)


def test_a_copys_likely_head_goes_in_front_of_the_drafters_block():
    """Copies whose first id is right and the rest wrong, a good drafter: the copy's
    first id, then the drafter's drafts."""
    policy = _policy(alpha=0.7)
    _copies(policy, match=4, copied=4, accepted=1)
    plan = policy.plan(limit=100, copied=15, match=4)
    assert plan.source == SPLICE and plan.copied == 1 and plan.size > 2
    # without a drafter there is nothing to splice: the copy alone
    assert policy.plan(100, copied=15, match=4, drafter=False) == Plan(LOOKUP, 2, 1)


def test_the_budget_caps_the_copy():
    policy = _policy(alpha=0.2)
    _copies(policy, match=4, copied=15, accepted=15)
    plan = policy.plan(limit=3, copied=15, match=4)
    assert plan.size <= 3 and plan.copied <= 2


def test_an_untimed_policy_runs_the_drafters_block():
    policy = AdaptiveBlockSize(8, prior=None)  # nothing timed: sizes get tried first
    assert policy.plan(limit=100, copied=8, match=4) == Plan(DRAFT, 8)


def test_copies_are_counted_apart_from_the_drafter():
    policy = _policy(alpha=0.5)
    before = (list(policy.accepted), list(policy.offered), dict(policy.seconds))
    _copies(policy, match=2, copied=5, accepted=2, blocks=3)
    assert (policy.accepted, policy.offered, policy.seconds) == before
    stats, aged = policy.lookup, 3 * stats_keep(policy)
    # ids 1 and 3 follow a 2-gram and a 4-gram (per position), id 2 a 3-gram
    assert stats.offered[:4] == pytest.approx([aged, 0.0, aged, 0.0])
    assert stats.gram_offered == pytest.approx([0.0, aged, aged, 0.0])
    assert stats.acceptance(2, 3) < stats.acceptance(2, 1)  # id 3 was never right
    assert 6 in policy.verify_seconds  # the copy's verify was timed


def stats_keep(policy) -> float:
    """The mean weight of three blocks' counts after aging (0, 1, 2 blocks old)."""
    keep = policy._keep
    return (1 + keep + keep**2) / 3


def test_lookup_stats_learn_per_match_length_and_share_what_they_learn():
    stats = LookupStats(4)
    assert stats.acceptance(4, 1) == stats.acceptance(1, 1) == 0.5  # the prior
    for _ in range(20):
        stats.count(match=4, copied=3, accepted=3)
        stats.count(match=1, copied=3, accepted=0)
    assert stats.acceptance(4, 1) > 0.8 > 0.2 > stats.acceptance(1, 1)
    assert stats.acceptance(4, 3) > 0.9  # ids after the first: over all copies
    assert stats.acceptance(4, 4) < 0.9  # never offered: its prior
    fresh = LookupStats(4)
    for _ in range(3):  # failures after 1-gram matches: 3-gram copies doubt too
        fresh.count(match=1, copied=3, accepted=0)
    assert fresh.acceptance(3, 1) < 0.2
    stats.age(0.5, floor=0.25)
    assert stats.prior_weight == 0.5 and stats.gram_offered[3] == 10.0
    stats.age(0.1, floor=0.25)
    assert stats.prior_weight == 0.25


def test_verify_estimate_interpolates_and_extrapolates():
    known = {1: 0.02, 4: 0.03, 8: 0.05}
    assert verify_estimate(known, 4) == 0.03
    assert verify_estimate(known, 6) == pytest.approx(0.04)
    assert verify_estimate(known, 16) == pytest.approx(0.09)  # the last two's slope
    assert verify_estimate({2: 0.02}, 4) == pytest.approx(0.02 * 1.3)  # one size
    assert verify_estimate({}, 4) is None


@pytest.mark.parametrize(
    "size, copied, drafter, plan",
    [
        (8, 0, True, Plan(DRAFT, 8)),
        (8, 7, True, Plan(LOOKUP, 8, 7)),
        (8, 12, True, Plan(LOOKUP, 8, 7)),
        (8, 3, True, Plan(SPLICE, 8, 3)),
        (8, 3, False, Plan(LOOKUP, 4, 3)),
        (1, 5, True, Plan(DRAFT, 1)),
    ],
)
def test_a_fixed_size_fills_its_block_with_the_copy(size, copied, drafter, plan):
    assert fixed_plan(size, copied, drafter) == plan
    assert FixedBlockSize(size).plan(100, copied, 2, drafter) == plan


# verify times a fresh policy measured on code edits (Intel Xeon, demo pair): its
# first block, of 8, paid for compiling MLX's kernels and 8 was never verified again
COMPILED_AT_8 = {1: 0.0480, 2: 0.0497, 3: 0.0559, 4: 0.0552, 8: 0.1967}


def test_a_verify_time_far_above_the_others_line_is_left_out():
    assert verify_estimate(COMPILED_AT_8, 8) < 0.07
    assert verify_estimate(COMPILED_AT_8, 6) < 0.065
    # a line that only grows keeps its points, however steep
    steep = {1: 0.01, 2: 0.02, 4: 0.04, 8: 0.08}
    assert verify_estimate(steep, 8) == 0.08 and verify_estimate(steep, 16) == 0.16


def test_a_stale_verify_time_does_not_keep_copies_short():
    policy = _policy(alpha=0.2, verify=COMPILED_AT_8)
    policy._timed_here["verify"] |= set(COMPILED_AT_8)  # measured in this process
    _copies(policy, match=4, copied=15, accepted=15, blocks=8)
    plan = policy.plan(limit=100, copied=15, match=4)
    assert plan.source == LOOKUP and plan.copied >= 7
    # one verify of 8 at its real cost replaces the outlier (smoothing would keep it)
    policy.observe(8, 7, 0.07, verified=8, verify_seconds=0.065, source=LOOKUP,
                   match=4, copied=7)  # fmt: skip
    assert policy.verify_seconds[8] == 0.065


def test_an_id_after_a_short_match_counts_as_a_longer_match():
    """A 1-gram copy whose first id was right continues a 2-gram: on code edits its
    second id was right 38% of the time, not the 95% of ids after 4-grams."""
    stats = LookupStats(15)
    for _ in range(20):
        stats.count(match=1, copied=8, accepted=1)  # the first right, the second not
        stats.count(match=4, copied=8, accepted=8)
    assert stats.acceptance(1, 2) < 0.2 < 0.9 < stats.acceptance(4, 2)
    assert stats.acceptance(3, 2) == stats.acceptance(4, 2)  # both follow 4-grams
    policy = _policy(alpha=0.2)
    policy.lookup = stats
    assert policy.plan(limit=100, copied=15, match=4).copied >= 8
    assert policy.plan(limit=100, copied=15, match=1).copied <= 1
