"""The adaptive block size: picks what is fastest here, stays lossless."""

import math

import pytest
from lossless import long_prompt, plain, spec
from oracles import OracleDraft

from dflash_mlx.engine.policy import (
    EXPLORE_BLOCKS,
    MAX_EXPLORE_GAP,
    AdaptiveBlockSize,
    FixedBlockSize,
)


def simulate(policy, accept_rate, cost, blocks=300):
    """Feed the policy blocks whose drafts are each accepted with `accept_rate`."""
    import random

    rng = random.Random(0)
    chosen = []
    for _ in range(blocks):
        size = policy.next()
        a = 0
        while a < size - 1 and rng.random() < accept_rate:
            a += 1
        policy.observe(size, a, cost(size))
        chosen.append(size)
    return chosen


def mostly(chosen):
    tail = chosen[len(chosen) // 2 :]
    return max(set(tail), key=tail.count)


def test_memory_bound_machine_and_good_drafter_use_big_blocks():
    # verify cost nearly flat in B (Apple GPU-like), drafter accepted 90% of the time
    chosen = simulate(
        AdaptiveBlockSize(16),
        0.9,
        lambda b: 0.02 + 0.0005 * b + (0.004 if b > 1 else 0),
    )
    assert mostly(chosen) == 16


def test_weak_drafter_falls_back_to_plain_decoding():
    chosen = simulate(
        AdaptiveBlockSize(16),
        0.02,
        lambda b: 0.02 + 0.001 * b + (0.005 if b > 1 else 0),
        blocks=1000,
    )
    assert mostly(chosen) == 1
    # explorations that keep losing back off, to one every MAX_EXPLORE_GAP blocks:
    # few detours late in the run (without the backoff: 2 blocks every 24)
    detours = sum(c != 1 for c in chosen[500:])
    assert detours <= EXPLORE_BLOCKS * (500 // MAX_EXPLORE_GAP + 1) < 2 * 500 // 24


def test_compute_bound_machine_prefers_small_blocks():
    # each verified token costs as much as the fixed overhead (slow BLAS CPU)
    chosen = simulate(AdaptiveBlockSize(16), 0.7, lambda b: 0.01 + 0.01 * b)
    assert mostly(chosen) in (2, 4)


def test_timings_are_kept_per_batch_width():
    """A batch of 8 verifies 8 rows a step: on a CPU its big blocks cost far more
    than one sequence's. Each width keeps its own t(B), a new width starts from the
    nearest one's, and the acceptance is shared."""
    p = AdaptiveBlockSize(8)
    alone = simulate(p, 0.8, lambda b: 0.03 + 0.001 * b)  # flat: big blocks win
    assert mostly(alone) == 8
    acceptance, seconds = p.acceptance(1), dict(p.seconds)
    p.at_width(8)
    assert p.seconds == seconds  # the nearest width's, to start with
    assert p.acceptance(1) == acceptance
    batched = simulate(p, 0.8, lambda b: 0.01 + 0.09 * b)  # 8 rows a size: steep
    assert mostly(batched) == 1
    assert p.acceptance(1) != acceptance  # the batch's blocks count for everyone
    p.at_width(1)  # back alone: its own timings, no relearning
    assert p.seconds[8] == pytest.approx(0.038)
    assert p.next() == 8


def test_a_batch_step_is_timed_once_and_counts_every_rows_acceptance():
    """A batch step observes one block per sequence: the first (step=True) times the
    step and takes a turn of the exploration schedule, the others only add their
    acceptance (else a step of 8 would explore 8 times as often and weigh its time 8
    times)."""
    batched, alone = AdaptiveBlockSize(8), AdaptiveBlockSize(8)
    for p in (batched, alone):
        for size in p.sizes:
            p.observe(size, 0, 0.01 * size)
        p.observe(4, 3, 0.2)
    for _ in range(7):
        batched.observe(4, 0, 9.0, step=False)  # a wrong time would show
    assert batched.seconds == alone.seconds and batched.blocks == alone.blocks
    assert batched.acceptance(1) < alone.acceptance(1)


def test_expected_tokens_and_exploration():
    p = AdaptiveBlockSize(8, explore_every=5, memory=math.inf)
    assert p.sizes == [1, 2, 4, 8]
    assert (
        p.expected_tokens(1) == 1 and p.expected_tokens(4) == 4
    )  # optimistic when untried
    firsts = [p.next() for _ in range(1)]
    assert firsts == [8]
    for size in (8, 4, 2, 1):
        p.observe(size, 0, 0.1)
    assert p.acceptance(1) == pytest.approx(1 / 4)
    assert p.next(limit=3) in (1, 2)


def test_fixed_block_size():
    assert FixedBlockSize(8).next(limit=3) == 3 and FixedBlockSize(8).next() == 8
    with pytest.raises(ValueError):
        FixedBlockSize(0)


def oracle_case(tiny_pair, family, wrong):
    """(model, tokenizer, drafter, prompt, greedy tokens, oracle wrong at `wrong`)."""
    from dflash_mlx import load, load_draft

    t, d = tiny_pair(family)
    model, tok = load(str(t))
    draft = load_draft(str(d))
    prompt = long_prompt(model, tok, 40)
    ref = plain(model, tok, prompt, 40)
    good = OracleDraft(draft.args, prompt + ref, wrong)
    good.update(draft.parameters())
    return model, tok, draft, prompt, ref, good


def test_auto_block_size_is_lossless(tiny_pair):
    model, tok, draft, prompt, ref, good = oracle_case(
        tiny_pair, "qwen3_5", lambda k, i: i % 11 == 0
    )
    out, responses = spec(model, good, tok, prompt, max_tokens=40, block_size="auto")
    assert out == ref
    assert len({r.block_size for r in responses[1:]}) > 1  # it explored sizes
    out, _ = spec(model, draft, tok, prompt, max_tokens=40, block_size="auto")
    assert out == ref
    with pytest.raises(ValueError, match="auto"):
        spec(model, draft, tok, prompt, max_tokens=4, block_size="fast")


def measured(
    costs: dict, tokens_per_block: float = 2.0, seconds_per_block: float = 0.1
):
    """A policy that has timed verifying T tokens (costs) and runs at the given pace."""
    p = AdaptiveBlockSize(8)
    for t, v in costs.items():
        p.observe(
            8,
            int(tokens_per_block) - 1,
            seconds_per_block,
            verified=t,
            verify_seconds=v,
        )
    return p


def test_no_cut_until_verify_costs_are_measured():
    p = AdaptiveBlockSize(8)
    assert p.cut([0.01] * 7) == 7
    p.observe(8, 0, 0.1, verified=8, verify_seconds=0.096)
    assert p.cut([0.01] * 7) == 7  # one size timed: no slope known yet


def test_cut_keeps_likely_drafts_where_verifying_costs_grow():
    # this CPU: v(1)=62 ms, v(2)=80 ms, v(8)=96 ms; running at 20 tok/s
    p = measured({1: 0.062, 2: 0.080, 8: 0.096})
    assert p.tokens_rate == pytest.approx(20.0)
    assert p.verify_cost(5) == pytest.approx(0.088)
    assert p.cut([0.05] * 7) == 0  # hopeless: a plain step is cheaper
    assert p.cut([0.97] * 7) == 7  # confident all the way
    assert (
        p.cut([0.9, 0.8, 0.05, 0.9, 0.9, 0.9, 0.9]) == 2
    )  # stop at the doubtful draft


def test_cut_keeps_everything_where_verifying_is_flat():
    p = measured({1: 0.030, 8: 0.030})  # memory-bound GPU: 8 tokens cost as much as 1
    assert p.cut([0.05] * 7) == 7


def test_the_cut_and_its_sync_only_where_verifying_costs_grow():
    assert not AdaptiveBlockSize(8).cut_may_drop(8)  # nothing measured: cut keeps all
    assert not measured({1: 0.030, 8: 0.031}).cut_may_drop(8)  # flat: v grows 1 ms
    assert measured({1: 0.062, 2: 0.080, 8: 0.096}).cut_may_drop(8)  # a CPU
    assert not measured({1: 0.062, 2: 0.080, 8: 0.096}).cut_may_drop(1)


class CuttingPolicy:
    """Drafts `size` tokens and verifies a different prefix length every block
    (where `may_drop` lets it)."""

    def __init__(self, size, may_drop=True):
        self.size, self.calls, self.may_drop = size, 0, may_drop
        self.verified: list[int] = []

    def cut_may_drop(self, size):
        return self.may_drop

    def next(self, limit=None):
        return self.size if limit is None else max(1, min(self.size, limit))

    def cut(self, confidence):
        self.calls += 1
        return (self.calls * 3) % (len(confidence) + 1)

    def observe(self, size, n_accepted, seconds, **measured):
        assert measured["verified"] <= size
        self.verified.append(measured["verified"])


@pytest.mark.parametrize("family", ["qwen3", "qwen3_5", "gemma4_text", "gpt_oss"])
def test_cut_blocks_are_lossless(tiny_pair, family):
    model, tok, _, prompt, ref, good = oracle_case(
        tiny_pair, family, lambda k, i: i % 7 == 0
    )
    policy = CuttingPolicy(8)
    out, responses = spec(model, good, tok, prompt, max_tokens=40, block_size=policy)
    assert out == ref
    assert policy.calls > 3
    assert {r.block_size for r in responses[1:]} - {1} and 1 in {
        r.block_size for r in responses
    }


def test_no_cut_is_asked_where_the_policy_says_it_cannot_pay(tiny_pair):
    """Where verifying costs no more for more tokens, the block is verified whole,
    with one sync: the cut (a second sync) is never asked."""
    model, tok, _, prompt, ref, good = oracle_case(
        tiny_pair, "qwen3", lambda k, i: i % 7 == 0
    )
    policy = CuttingPolicy(8, may_drop=False)
    out, _ = spec(model, good, tok, prompt, max_tokens=40, block_size=policy)
    assert out == ref
    assert policy.calls == 0
    assert set(policy.verified[:-1]) == {8}  # the last block is capped by max_tokens


def test_a_pause_counts_as_a_slower_block_not_as_a_new_cost():
    """One block slowed by the process pausing (a page fault, another program) moves
    the size's time estimate by at most TIME_OUTLIER x the smoothing."""
    from dflash_mlx.engine.policy import TIME_OUTLIER

    p = AdaptiveBlockSize(8)
    p.observe(2, 1, 0.040, verified=2, verify_seconds=0.035)
    p.observe(2, 1, 0.400, verified=2, verify_seconds=0.350)  # a 10x pause
    step = p.smoothing * (TIME_OUTLIER - 1)
    assert p.seconds[2] == pytest.approx(0.040 * (1 + step))
    assert p.verify_seconds[2] == pytest.approx(0.035 * (1 + step))
    p.observe(2, 1, 0.030, verified=2)  # faster blocks count in full
    assert p.seconds[2] == pytest.approx(0.040 * (1 + step) * 0.7 + 0.030 * 0.3)


def test_stored_times_follow_the_first_verify_this_process_measures():
    """Calibrated times from another moment (here 1.5x too slow): the first v(T)
    measured here replaces the stored one and scales every stored time not yet
    measured here by the same ratio; measured ones are smoothed as usual."""
    p = AdaptiveBlockSize(8)
    p.seconds = {1: 0.045, 2: 0.054, 4: 0.066, 8: 0.090}
    p.verify_seconds = {1: 0.042, 2: 0.048, 4: 0.060, 8: 0.072}
    p.observe(8, 0, 0.035, verified=1, verify_seconds=0.028)  # the cut kept none
    assert p.verify_seconds == pytest.approx({1: 0.028, 2: 0.032, 4: 0.040, 8: 0.048})
    # t(8) was timed with the cut: smoothed from its rescaled stored time
    assert p.seconds[8] == pytest.approx(0.060 + p.smoothing * (0.035 - 0.060))
    assert p.seconds[1] == pytest.approx(0.030) and p.seconds[2] == pytest.approx(0.036)
    # a verify size never stored compares with the interpolated time: v(3) = 0.036
    p.observe(4, 1, 0.040, verified=3, verify_seconds=0.036 * 0.5)
    assert p.verify_seconds[3] == pytest.approx(0.018)
    assert p.verify_seconds[2] == pytest.approx(0.016)  # not measured here yet: halved
    assert p.verify_seconds[1] == pytest.approx(0.028)  # measured here: kept
    p.observe(2, 1, 0.030, verified=2, verify_seconds=0.030)  # later: smoothed
    assert p.verify_seconds[2] == pytest.approx(0.016 * 1.5)  # capped as a pause
