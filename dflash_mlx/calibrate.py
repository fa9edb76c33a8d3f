"""Timing every block size before the first answer: the load-time warm-up as a
calibration of the adaptive policy.

A throwaway greedy generation runs each size the policy can choose (largest first, each
`repeats` times, every draft verified) and hands the policy what it measured: t(B) for
each block size B (all drafts verified) and v(T) for each verify size T.
The first run of a shape pays for compiling MLX's kernels, so the last run counts. Only
timings are kept: the acceptance of a throwaway prompt says nothing about the user's.
"""

from typing import Any, cast

from .adaptive import AdaptiveBlockSize

# a prompt the target continues for a while: few early stop tokens
PROMPT = "Count from one to forty in words: one, two, three, four, five, six, seven,"
ATTEMPTS = 3  # generations tried when one ends (a stop token) before the schedule


class _Schedule:
    """A block-size policy that runs `order` and records what each block measured."""

    def __init__(self, order: list[int]):
        self.order = order
        self.measured: list[tuple[int, int, float, float | None]] = []

    @property
    def remaining(self) -> list[int]:
        return self.order[len(self.measured) :]

    def next(self, limit: int | None = None) -> int:
        size = (self.remaining or [1])[0]
        return size if limit is None else max(1, min(size, limit))

    def cut(self, confidence: list) -> int:
        # verify every draft; having a cut makes the engine time verify apart, as in
        # the adaptive policy's own blocks
        return len(confidence)

    def observe(
        self, size, n_accepted, seconds, verified=None, verify_seconds=None, **_
    ):
        if self.remaining:
            self.measured.append((size, verified or size, seconds, verify_seconds))


def calibrate(
    model,
    draft,
    tokenizer,
    policy: AdaptiveBlockSize | None = None,
    repeats: int = 2,
) -> AdaptiveBlockSize:
    """`policy` (default: `AdaptiveBlockSize.for_drafter(draft)`) with every size and
    verify size timed on this machine by a short throwaway generation."""
    from .generate import stream_generate

    policy = policy or AdaptiveBlockSize.for_drafter(draft)
    order = [s for s in reversed(policy.sizes) for _ in range(repeats)]
    ids = tokenizer.encode(PROMPT)
    for _ in range(ATTEMPTS):
        schedule = _Schedule(order)
        for _ in stream_generate(
            model,
            draft,
            tokenizer,
            ids,
            block_size=cast(Any, schedule),  # a policy object, as the API allows
            max_tokens=1 + sum(order),
        ):
            pass
        _adopt(policy, schedule.measured)
        order = schedule.remaining
        if not order:
            break
    return policy


def _adopt(policy: AdaptiveBlockSize, measured: list):
    """Set the policy's timings from the schedule's blocks (later runs win)."""
    for size, verified, seconds, verify_seconds in measured:
        if verified != size:  # capped by the budget: not a full block of its size
            continue
        policy.seconds[size] = seconds
        if verify_seconds is not None:
            policy.verify_seconds[size] = verify_seconds
