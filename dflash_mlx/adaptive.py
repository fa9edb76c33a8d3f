"""Choosing the verify block size from what this machine and this drafter actually do.

A block of size B costs t(B) seconds (one draft forward + one target forward over B
tokens; B = 1 is plain decoding, no drafter) and commits E(B) tokens on average, where
E(B) = 1 + sum_{j<B} prod_{k<=j} alpha_k and alpha_k is the rate at which the k-th draft
is accepted given the ones before it were. The policy measures both as it goes and picks
the B with the most tokens per second, so a slow machine or a weak drafter falls back to
plain decoding instead of running slower than it. Any B is lossless; only speed depends
on it.

Within a block it also decides how many drafts to verify (`cut`): verifying T tokens
costs v(T), measured per T, and draft k is worth verifying when the tokens it is
expected to add (the product of the drafter's confidences up to k) pay for its share of
v at the current rate. Where v grows with T (CPUs) this skips hopeless drafts; where v
is flat (GPUs running a big target) it keeps them all.
"""


class AdaptiveBlockSize:
    """Picks block sizes among the powers of two below `max_size`, and `max_size`."""

    def __init__(self, max_size: int, explore_every: int = 24, smoothing: float = 0.3):
        if max_size < 1:
            raise ValueError(f"max block size must be >= 1, got {max_size}.")
        self.sizes = sorted(
            {1, max_size} | {s for s in (2, 4, 8, 16, 32) if s < max_size}
        )
        self.explore_every = explore_every
        self.smoothing = smoothing
        self.accepted = [0.0] * max_size  # accepted[k]: draft k+1 accepted
        self.offered = [
            0.0
        ] * max_size  # offered[k]: draft k+1 verified after k accepted
        self.seconds: dict[int, float] = {}
        self.blocks = 0
        self._explore_next = 0
        self._gap = (
            explore_every  # blocks until the next exploration; doubles while they lose
        )
        self._explored: int | None = None
        self.verify_seconds: dict[
            int, float
        ] = {}  # v(T): target time to verify T tokens
        self._tokens: float | None = None  # committed tokens per block, smoothed
        self._block_seconds: float | None = None  # seconds per block, smoothed

    def acceptance(self, k: int) -> float:
        """Estimated P(draft k accepted | drafts 1..k-1 accepted), k >= 1."""
        # one optimistic pseudo-observation so untried positions still get explored
        return (self.accepted[k - 1] + 1.0) / (self.offered[k - 1] + 1.0)

    def expected_tokens(self, size: int) -> float:
        total, run = 1.0, 1.0
        for k in range(1, size):
            run *= self.acceptance(k)
            total += run
        return total

    def rate(self, size: int) -> float | None:
        """Expected tokens per second at `size`, or None before it has been timed."""
        t = self.seconds.get(size)
        return None if t is None else self.expected_tokens(size) / t

    def _timed_rate(self, size: int) -> float:
        # only called for sizes already timed, whose rate is known
        return self.rate(size) or 0.0

    def next(self, limit: int | None = None) -> int:
        """The block size to use next (never above `limit`)."""
        sizes = [s for s in self.sizes if limit is None or s <= limit] or [1]
        untried = [s for s in sizes if s not in self.seconds]
        if untried:
            return untried[-1]
        best = max(sizes, key=self._timed_rate)
        if self._gap and self.blocks >= self._gap:
            # re-time another size now and then: speed and acceptance drift with context
            self._explore_next = (self._explore_next + 1) % len(sizes)
            explored = sizes[self._explore_next]
            if explored != best:
                self._explored, self.blocks = explored, 0
                return explored
        return best

    def _after_exploring(self, size: int):
        sizes = [s for s in self.sizes if s in self.seconds]
        won = size == max(sizes, key=self._timed_rate)
        self._gap = self.explore_every if won else min(self._gap * 2, 1024)
        self._explored = None

    def observe(
        self,
        size: int,
        n_accepted: int,
        seconds: float,
        verified: int | None = None,
        verify_seconds: float | None = None,
    ):
        """Record a block: size drafted, drafts accepted, wall time, and (when the block
        was cut) how many tokens the target verified and how long that took."""
        verified = size if verified is None else verified
        self.blocks += 1
        for k in range(min(n_accepted + 1, verified - 1)):
            self.offered[k] += 1
            if k < n_accepted:
                self.accepted[k] += 1
        self.seconds[size] = self._smooth(self.seconds.get(size), seconds)
        if verify_seconds is not None:
            self.verify_seconds[verified] = self._smooth(
                self.verify_seconds.get(verified), verify_seconds
            )
        self._tokens = self._smooth(self._tokens, n_accepted + 1)
        self._block_seconds = self._smooth(self._block_seconds, seconds)
        if size == self._explored:
            self._after_exploring(size)

    def _smooth(self, old: float | None, new: float) -> float:
        return new if old is None else old + self.smoothing * (new - old)

    @property
    def tokens_rate(self) -> float | None:
        """Recent committed tokens per second (the rate a cut must beat)."""
        if self._tokens is None or not self._block_seconds:
            return None
        return self._tokens / self._block_seconds

    def verify_cost(self, tokens: int) -> float | None:
        """v(T) interpolated between measured sizes (flat beyond); None if unknown."""
        known = sorted(self.verify_seconds.items())
        if len(known) < 2:
            return None
        lower = [(t, v) for t, v in known if t <= tokens] or known[:1]
        upper = [(t, v) for t, v in known if t >= tokens] or known[-1:]
        (t0, v0), (t1, v1) = lower[-1], upper[0]
        return v0 if t1 == t0 else v0 + (v1 - v0) * (tokens - t0) / (t1 - t0)

    def cut(self, confidence: list) -> int:
        """How many of the drafts (with the drafter's probabilities `confidence`) to
        verify.

        Maximises expected tokens − rate × v(1 + k): verifying more pays only if the
        drafts are likely enough to be accepted. Until v and the rate are measured, all.
        """
        n = len(confidence)
        measured = [self.verify_cost(t) for t in range(1, n + 2)]
        costs = [c for c in measured if c is not None]
        rate = self.tokens_rate
        if rate is None or len(costs) < len(measured):
            return n
        best_k, best = 0, 1.0 - rate * costs[0]
        expected, run = 1.0, 1.0
        for k, c in enumerate(confidence, start=1):
            run *= c
            expected += run
            value = expected - rate * costs[k]
            if value > best:
                best_k, best = k, value
        return best_k


class FixedBlockSize:
    """Always the same block size (capped by the tokens still allowed)."""

    def __init__(self, size: int):
        if size < 1:
            raise ValueError(f"block_size must be >= 1, got {size}.")
        self.size = size

    def next(self, limit: int | None = None) -> int:
        return self.size if limit is None else max(1, min(self.size, limit))

    def observe(self, size: int, n_accepted: int, seconds: float, **measured):
        pass
