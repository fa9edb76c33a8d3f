"""A sharded target's ranks in lockstep: what could differ between them is rank 0's.

Every rank runs the same speculative loop (see distributed.py); the adaptive policy's
choices come from wall-clock timings and an unseeded sampling's seed from the OS, so
both are broadcast from rank 0.
"""

import os

from ..distributed import Group
from .sources import Plan


class Lockstep:
    """A block-size policy whose decisions are rank 0's on every rank."""

    def __init__(self, policy, group: Group):
        self.policy, self.group = policy, group
        if hasattr(policy, "cut"):
            self.cut = self._cut
        if hasattr(policy, "cut_may_drop"):
            self.cut_may_drop = self._cut_may_drop
        if hasattr(policy, "plan"):
            self.plan = self._plan

    def next(self, limit: int | None = None) -> int:
        return self.group.broadcast([self.policy.next(limit=limit)])[0]

    def _cut(self, confidence: list) -> int:
        return self.group.broadcast([self.policy.cut(confidence)])[0]

    def _cut_may_drop(self, size: int) -> bool:
        return bool(self.group.broadcast([int(self.policy.cut_may_drop(size))])[0])

    def _plan(self, limit: int, copied: int, match: int = 0, drafter: bool = True):
        # every rank holds the same history, so the same copy: all ask together
        plan = self.policy.plan(limit, copied, match, drafter)
        return Plan(*self.group.broadcast(list(plan)))

    def observe(self, *args, **kwargs):
        self.policy.observe(*args, **kwargs)

    def __getattr__(self, name):  # the wrapped policy's statistics
        return getattr(self.__dict__["policy"], name)


def shared_seed(group: Group) -> int:
    """A seed drawn on rank 0 and used by all: sampled tokens agree on every rank."""
    return group.broadcast([int.from_bytes(os.urandom(4), "little") >> 1])[0]
