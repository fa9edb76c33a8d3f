"""The block-size policy in a batch, on simulated machines (no wall clock read).

A batch of W rows verifies W x B tokens a step: on a CPU's generic kernels that cost
grows steeply with W x B, on a GPU it stays nearly flat. The real policy
(`AdaptiveBlockSize` at width W, one observation per row as engine/batch.py makes them)
must then cost next to nothing against plain batching where drafting cannot pay, and
gain where it can. The drafter's upkeep after plain steps (the features it absorbs
before its next draft) is charged to the next drafted step, as the engine does."""

import random
from dataclasses import dataclass

import pytest
from test_lookup_policy import GSM8K_PRIOR

from dflash_mlx.engine.policy import AdaptiveBlockSize

ALPHA = [a / o for a, o in zip(GSM8K_PRIOR.accepted, GSM8K_PRIOR.offered, strict=True)]


@dataclass
class Machine:
    """Seconds: verify c0 + c1*W*B, draft d0 + d1*W*B, upkeep a0 + a1*W*pending."""

    c0: float
    c1: float
    d0: float
    d1: float
    a0: float
    a1: float

    def step(self, width: int, size: int, pending: int) -> float:
        t = self.c0 + self.c1 * width * size
        if size > 1:
            t += self.d0 + self.d1 * width * size
            t += self.a0 + self.a1 * width * pending
        return t


# a 2-core CPU on MLX's generic kernels: 8 rows x 8 tokens cost 4.5x 8 rows x 1
STEEP = Machine(0.020, 0.0025, 0.002, 0.0001, 0.001, 0.00005)
# a GPU: 8 x 8 rows cost 1.1x 8 x 1
FLAT = Machine(0.020, 0.00005, 0.002, 0.00001, 0.001, 0.000005)


def seconds_per_token(machine: Machine, width: int, steps: int, seed: int, spec=True):
    rng = random.Random(seed)
    policy = AdaptiveBlockSize(8, prior=GSM8K_PRIOR)
    policy.at_width(width)
    elapsed, tokens, pending = 0.0, 0.0, 0
    for _ in range(steps):
        size = policy.next(limit=1 << 20) if spec else 1
        seconds = machine.step(width, size, pending + 1)
        pending = 0 if size > 1 else pending + 1
        for row in range(width):
            n = 0
            while n < size - 1 and rng.random() < ALPHA[min(n, len(ALPHA) - 1)]:
                n += 1
            policy.observe(size, n, seconds, verified=size, step=row == 0)
            tokens += n + 1
        elapsed += seconds
    return elapsed / tokens


def speedup(machine: Machine, width: int, steps: int = 1000, seeds: int = 5) -> float:
    """Plain batching's seconds per token over the policy's (above 1: faster)."""
    ratios = [
        seconds_per_token(machine, width, steps, s, spec=False)
        / seconds_per_token(machine, width, steps, s)
        for s in range(seeds)
    ]
    return sum(ratios) / len(ratios)


@pytest.mark.parametrize("width", [4, 8])
def test_a_steep_batched_verify_costs_at_most_3_percent_against_plain(width):
    assert speedup(STEEP, width) >= 0.97


def test_a_single_sequence_still_drafts_on_the_steep_machine():
    assert speedup(STEEP, 1) > 1.15


@pytest.mark.parametrize("width", [1, 4, 8])
def test_a_flat_batched_verify_keeps_drafting_at_every_width(width):
    assert speedup(FLAT, width) > 1.4
