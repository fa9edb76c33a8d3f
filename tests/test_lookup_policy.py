"""What prompt lookup's per-block choice costs and gains, on a simulated machine.

The real policy (`AdaptiveBlockSize.plan`) runs against synthetic timings (the demo
pair's CPU, verify time growing with the tokens verified), a calibrated drafter (as in
test_policy_start.py) and copies that are right with a chosen probability; no wall
clock is read. Copies that are always wrong must cost next to nothing against no lookup
(the policy stops copying), copies that are right must pay several times over, and a
drafter that does well must keep its blocks."""

import random

from dflash_mlx.engine.policy import AdaptiveBlockSize
from dflash_mlx.engine.sources import DRAFT, LOOKUP, SPLICE
from dflash_mlx.models.acceptance import Acceptance

# verify T tokens (seconds): the demo pair on a 2-core CPU, about 1.8x at 8, 2.6x at 16
V = {t: 0.030 * (1 + 0.11 * (t - 1)) for t in range(1, 17)}
DRAFT_SECONDS, SYNC, BOOKKEEPING = 0.005, 0.001, 0.0005
GSM8K_PRIOR = Acceptance(
    8,
    offered=[969, 458, 248, 141, 73, 46, 37],
    accepted=[458, 248, 141, 73, 46, 37, 29],
)


def calibrated() -> AdaptiveBlockSize:
    p = AdaptiveBlockSize(8, prior=GSM8K_PRIOR)
    for size in p.sizes:
        p.seconds[size] = V[1] if size == 1 else DRAFT_SECONDS + SYNC + V[size]
        p.verify_seconds[size] = V[size]
    return p


class Text:
    """A synthetic answer: how often a copy is offered and right, and the drafter's
    confidences (it is calibrated: a draft is right with its confidence)."""

    def __init__(self, offered: float, right: float, drafter: str, seed: int):
        self.offered, self.right, self.drafter = offered, right, drafter
        # apart, so that runs with and without copies see the same drafts
        self.rng, self.copies = random.Random(seed), random.Random(seed + 10_000)

    def copy(self) -> tuple[int, int]:
        """(ids copied, match length), (0, 0) when the index finds nothing."""
        offered, match = self.copies.random(), self.copies.randint(1, 4)
        return (15, match) if offered < self.offered else (0, 0)

    def copy_accepted(self, k: int) -> int:
        n = 0
        while n < k and self.copies.random() < self.right:
            n += 1
        return n

    def confidences(self, n: int) -> list[float]:
        if self.drafter == "code":  # tau ~1.1
            first = self.rng.betavariate(0.4, 4)
            return [first] + [self.rng.betavariate(1.5, 1.5) for _ in range(n - 1)]
        first = self.rng.betavariate(0.9, 1.0)  # gsm8k: tau ~2
        return [first] + [self.rng.betavariate(1.1, 0.9) for _ in range(n - 1)]

    def drafts_accepted(self, confidence: list[float], kept: int) -> int:
        n = 0
        while n < kept and self.rng.random() < confidence[n]:
            n += 1
        return n


def _drafted(policy, text: Text, size: int):
    """(accepted, seconds, verified) of the drafter's block of `size`."""
    if size == 1:
        return 0, V[1], 1
    confidence = text.confidences(size - 1)
    kept = policy.cut(confidence)
    seconds = DRAFT_SECONDS + SYNC + V[kept + 1]
    return text.drafts_accepted(confidence, kept), seconds, kept + 1


def seconds_per_token(text: Text, tokens: int, lookup: bool) -> tuple[float, dict]:
    """Run a calibrated policy for `tokens`: seconds per token, blocks per source."""
    policy, committed, elapsed, used = calibrated(), 0, 0.0, {}
    while committed < tokens:
        copied, match = text.copy()
        copied = copied if lookup else 0
        plan = policy.plan(100, copied, match) if copied else None
        source = plan.source if plan else DRAFT
        used[source] = used.get(source, 0) + 1
        extra = {}
        if source == DRAFT:
            size = plan.size if plan else policy.next()
            accepted, seconds, verified = _drafted(policy, text, size)
        elif source == LOOKUP:
            size = verified = plan.size
            accepted, seconds = text.copy_accepted(plan.copied), BOOKKEEPING + V[size]
        else:
            size = verified = plan.size
            accepted = text.copy_accepted(plan.copied)
            if accepted == plan.copied:
                rest = text.confidences(size - 1)[plan.copied :]
                accepted += text.drafts_accepted(rest, len(rest))
            seconds = DRAFT_SECONDS + V[size]
        if plan and source != DRAFT:
            extra = dict(source=source, match=match, copied=plan.copied)
        policy.observe(
            size, accepted, seconds, verified=verified, verify_seconds=seconds, **extra
        )
        committed += accepted + 1
        elapsed += seconds
    return elapsed / committed, used


def ratio(offered, right, drafter, tokens=256, seeds=30) -> float:
    """Mean seconds per token with lookup over without it (below 1: faster)."""
    runs = []
    for s in range(seeds):
        with_lookup, _ = seconds_per_token(
            Text(offered, right, drafter, s), tokens, True
        )
        without, _ = seconds_per_token(Text(offered, right, drafter, s), tokens, False)
        runs.append(with_lookup / without)
    return sum(runs) / len(runs)


def test_copies_that_are_always_wrong_cost_next_to_nothing():
    """A few blocks to learn it (0.9% and 1.9% here), then a re-try every ~130."""
    assert ratio(offered=0.9, right=0.0, drafter="code") < 1.025
    assert ratio(offered=0.9, right=0.0, drafter="gsm8k") < 1.03


def test_copies_of_an_edited_file_pay_several_times_over():
    # a function restated with few changes: copies offered often, ids right 90%
    assert ratio(offered=0.9, right=0.9, drafter="code", tokens=512) < 0.4


def test_a_good_drafter_keeps_its_blocks_where_copies_are_weak():
    assert ratio(offered=0.6, right=0.3, drafter="gsm8k") < 1.04
    _, used = seconds_per_token(Text(0.6, 0.3, "gsm8k", 0), 512, True)
    assert used.get(DRAFT, 0) > 5 * (used.get(LOOKUP, 0) + used.get(SPLICE, 0))
