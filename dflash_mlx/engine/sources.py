"""Where a block's proposals come from: the drafter, prompt lookup, or a splice of both.

Per block, when prompt lookup has a copy (`lookup.LookupIndex.propose`), the policy
(`policy.AdaptiveBlockSize.plan`) weighs three blocks by expected tokens per second:
- `DRAFT`: the drafter's block of the size `next` chose (1 is plain decoding), as
  without lookup;
- `LOOKUP`: the first k ids of the copy, verified without a drafter forward;
- `SPLICE`: a drafter block of size B whose first k drafts are replaced by the copy's
  first k ids (the copy first, the drafter's drafts for the positions after it): where
  the copy's first ids are likely and the drafter beats its later ones.

The expected tokens come from the acceptance each source has shown: the drafter's
per-position acceptance (the policy's α), and the copies' own per position and by the
length of the n-gram matched (`LookupStats`: a copy after a 4-gram match is right far
more often than after a 1-gram one). The costs come from the measured times: a block
costs its overhead (everything but the verify: a drafter forward and absorb for drafted
blocks, bookkeeping alone for plain and lookup ones) plus v(T), the verify time of T
tokens (`Costs`). Where v is flat (a GPU) the longest copy wins; where it grows (CPUs)
a copy is cut where its next id no longer pays for itself.

None of this looks at the drafts' values or the target's draws, only at the history
(the copy's length and match) and at past blocks, so sampling keeps the target's
distribution. When lookup finds nothing, the policy is asked `next` as before.
"""

from statistics import median
from typing import NamedTuple

DRAFT, LOOKUP, SPLICE = 0, 1, 2
NAMES = ("draft", "lookup", "splice")
MATCH_BUCKETS = 4  # matches of 4+ tokens share one count
# A copied id's acceptance before any is observed: after a 1- to 3-gram (a first id, or
# an id whose copy started from a short match), after a 4-gram or longer (code-edit
# answers of the demo pair: 0.27 after a 1-gram, 0.45 after a 2-gram, 0.83 after a
# 3-gram, 0.95 after longer ones), worth this many blocks. An n-gram length's counts
# lean on the rate of all copies' first ids as SHRINK blocks, so copies failing after
# one length teach the others at once.
LOOKUP_PRIOR = (0.5, 0.8)
LOOKUP_PRIOR_BLOCKS = 1.0
# the prior ages down to this weight: after copies that failed it no longer pulls their
# rate back up until their counts have faded (~130 blocks; a re-try then costs a block)
LOOKUP_PRIOR_FLOOR = 0.25
SHRINK = 2.0
# v(T)'s growth per token when only one verify size is timed (a CPU's, about that of
# the demo pair); replaced as soon as a second size is measured.
GUESSED_SLOPE = 0.15
# A block time counts at most this many times the current estimate: a pause of the
# process (a page fault, another program) is not what a block size costs.
TIME_OUTLIER = 1.5


class Plan(NamedTuple):
    """A block to run: its source, its size, and the copied ids it starts with."""

    source: int  # DRAFT, LOOKUP or SPLICE
    size: int  # positions, `last` included: the drafter's block (DRAFT, SPLICE) or
    # 1 + copied (LOOKUP)
    copied: int = 0  # lookup ids at the head of the proposal

    @property
    def name(self) -> str:
        return NAMES[self.source]


def fixed_plan(size: int, copied: int, drafter: bool) -> Plan:
    """A fixed block size with lookup: the copy fills the block (no drafter forward)
    when long enough, else a splice; the drafter's block when there is no copy."""
    k = min(copied, size - 1)
    if k <= 0:
        return Plan(DRAFT, size)
    if k == size - 1 or not drafter:
        return Plan(LOOKUP, 1 + k, k)
    return Plan(SPLICE, size, k)


class FixedBlockSize:
    """Always the same block size (capped by the tokens still allowed)."""

    def __init__(self, size: int):
        if size < 1:
            raise ValueError(f"block_size must be >= 1, got {size}.")
        self.size = size

    def next(self, limit: int | None = None) -> int:
        return self.size if limit is None else max(1, min(self.size, limit))

    def plan(self, limit: int, copied: int, match: int = 0, drafter: bool = True):
        """With prompt lookup: the copy fills the block when it can, else a splice."""
        return fixed_plan(self.next(limit), copied, drafter)

    def observe(self, size: int, n_accepted: int, seconds: float, **measured):
        pass


class LookupStats:
    """The acceptance of copies, aged as the drafter's is, per length of the n-gram
    a copied id follows. A copy after an m-gram match whose first j ids were right
    is, for its next id, a copy after an (m+j)-gram match: ids following 1- to
    3-grams count per length (`gram_accepted[n - 1]`, `gram_offered[n - 1]`), those
    following 4-grams or longer per position in the copy (`accepted[k]` counts ids
    k+1 accepted, `offered[k]` those reached). On code edits a 1-gram match's first
    id was right 27% of the time and, when it was, its second only 38% (it follows a
    2-gram), where a 4-gram's ids were right 95-97% at every position."""

    def __init__(self, positions: int):
        self.positions = positions
        self.accepted = [0.0] * positions
        self.offered = [0.0] * positions
        self.gram_accepted = [0.0] * MATCH_BUCKETS
        self.gram_offered = [0.0] * MATCH_BUCKETS
        self.prior_weight = LOOKUP_PRIOR_BLOCKS

    def acceptance(self, match: int, k: int) -> float:
        """Estimated P(copied id k accepted | ids 1..k-1 were), k >= 1, after a
        `match`-gram match."""
        grams = max(match, 1) + k - 1
        if k > 1 and grams >= MATCH_BUCKETS:
            return self._at(k, LOOKUP_PRIOR[1])
        # a first id, or an id after a short match: its n-gram length's rate,
        # leaning on the first ids' over all lengths
        n = min(grams, MATCH_BUCKETS) - 1
        pooled = self._at(1, LOOKUP_PRIOR[0])
        return (self.gram_accepted[n] + SHRINK * pooled) / (
            self.gram_offered[n] + SHRINK
        )

    def _at(self, k: int, prior: float) -> float:
        """Copied id k's rate over all copies, leaning on `prior`."""
        if k > self.positions:
            return prior
        w = self.prior_weight
        return (self.accepted[k - 1] + w * prior) / (self.offered[k - 1] + w)

    def count(self, match: int, copied: int, accepted: int):
        """A copy of `copied` ids after a `match`-gram match, `accepted` of them
        right."""
        for k in range(min(accepted + 1, copied)):  # id k+1 was verified
            right, grams = k < accepted, max(match, 1) + k
            if k == 0 or grams < MATCH_BUCKETS:
                n = min(grams, MATCH_BUCKETS) - 1
                self.gram_offered[n] += 1
                self.gram_accepted[n] += right
            if (k == 0 or grams >= MATCH_BUCKETS) and k < self.positions:
                self.offered[k] += 1
                self.accepted[k] += right

    def age(self, keep: float, floor: float):
        if keep < 1.0:
            for row in (
                self.accepted, self.offered, self.gram_accepted, self.gram_offered
            ):  # fmt: skip
                row[:] = [x * keep for x in row]
            self.prior_weight = max(self.prior_weight * keep, floor)


class Costs:
    """What a block costs apart from its verify: smoothed per kind of block (plain and
    lookup blocks: 1; drafted and spliced blocks: their drafter block size)."""

    def __init__(self, smoothing: float):
        self.smoothing = smoothing
        self.overhead: dict[int, float] = {}

    def observe(self, key: int, seconds: float, verify_seconds: float | None):
        if verify_seconds is None:
            return
        value = max(seconds - verify_seconds, 0.0)
        old = self.overhead.get(key)
        self.overhead[key] = (
            value if old is None else old + self.smoothing * (value - old)
        )

    def estimate(self, policy, key: int) -> float | None:
        """The overhead of a `key` block: measured, else t(key) - v(key) from the
        policy's (calibrated) tables."""
        if key in self.overhead:
            return self.overhead[key]
        t, v = policy.seconds.get(key), policy.verify_seconds.get(key)
        return None if t is None or v is None else max(t - v, 0.0)


def interpolated(known: dict[int, float], tokens: int) -> float | None:
    """v(T) interpolated between the timed sizes (flat beyond); None below two."""
    points = sorted(known.items())
    if len(points) < 2:
        return None
    lower = [(t, v) for t, v in points if t <= tokens] or points[:1]
    upper = [(t, v) for t, v in points if t >= tokens] or points[-1:]
    (t0, v0), (t1, v1) = lower[-1], upper[0]
    return v0 if t1 == t0 else v0 + (v1 - v0) * (tokens - t0) / (t1 - t0)


def verify_estimate(known: dict[int, float], tokens: int) -> float | None:
    """v(T) from the timed verify sizes (`VerifyCurve`); None when none is timed."""
    return VerifyCurve(known)(tokens)


class VerifyCurve:
    """v(T) from the timed verify sizes, built once per block: interpolated between
    them, extended beyond the largest along the line through the two largest (never
    falling), and from one size with `GUESSED_SLOPE`.

    A time far above a robust line through all of them (`TIME_OUTLIER`) is left
    out: times are noisy upwards only (the first run of a shape pays for compiling
    MLX's kernels, the process may be paused), and a size timed once that way and
    never again (the copies it priced out are never verified) would keep every
    longer copy out."""

    def __init__(self, known: dict[int, float]):
        points = sorted(known.items())
        if len(points) > 2:
            slope, base = _line(points)
            points = [
                (t, v) for t, v in points if v <= TIME_OUTLIER * (base + slope * t)
            ]
        self.points = points

    def __call__(self, tokens: int) -> float | None:
        points = self.points
        if not points:
            return None
        if len(points) == 1:
            t0, v0 = points[0]
            return v0 * (1 + GUESSED_SLOPE * (tokens - t0))
        if tokens > points[-1][0]:
            (t0, v0), (t1, v1) = points[-2], points[-1]
            return v1 + max(v1 - v0, 0.0) / (t1 - t0) * (tokens - t1)
        lower = [p for p in points if p[0] <= tokens] or points[:1]
        (t0, v0), (t1, v1) = lower[-1], next(p for p in points if p[0] >= tokens)
        return v0 if t1 == t0 else v0 + (v1 - v0) * (tokens - t0) / (t1 - t0)


def _line(points: list[tuple[int, float]]) -> tuple[float, float]:
    """(slope, intercept) of a robust line through `points` (sorted, distinct
    sizes): the median of the slopes between neighbours and the median intercept,
    so one stale time (which tilts only its two neighbouring slopes) does not move
    it; the slope is never below 0. Linear in the points: it runs every block."""
    pairs = zip(points, points[1:], strict=False)
    slopes = [(v1 - v0) / (t1 - t0) for (t0, v0), (t1, v1) in pairs]
    slope = max(median(slopes), 0.0)
    return slope, median(v - slope * t for t, v in points)


def choose(policy, limit: int, copied: int, match: int, drafter: bool) -> Plan:
    """The plan with the most expected tokens per second (see the module docstring):
    the drafter's block `policy.next(limit)` chose, or a copy of 1..`copied` ids, or a
    splice of the copy into a drafter block. A copy must beat the drafter's best size,
    not the one `next` may be exploring (that exploration runs when it wins)."""
    size = policy.next(limit)
    best = Plan(DRAFT, size)
    if policy.rate(size) is None or copied < 1:
        return best  # a size being timed for the first time: let it run
    rates = [policy.rate(s) for s in policy.sizes if s <= max(limit, 1)]
    rate = max(r for r in rates if r is not None)
    plain = policy.costs.estimate(policy, 1)
    # once per block (this runs every block): v(T), and each position's acceptance
    # for the copy and for the drafter
    verify = VerifyCurve(policy.verify_seconds)
    largest = max(policy.sizes)
    copies = [
        policy.lookup.acceptance(match, k)
        for k in range(1, min(copied, max(limit - 1, largest - 2)) + 1)
    ]
    reach, expected = 1.0, 1.0
    for k, beta in enumerate(copies[: max(limit - 1, 0)], start=1):
        reach *= beta
        expected += reach
        v = verify(1 + k)
        if plain is None or v is None:
            break
        if expected / (plain + v) > rate:
            best, rate = Plan(LOOKUP, 1 + k, k), expected / (plain + v)
    if not drafter:
        return best
    drafts = [policy.acceptance(k) for k in range(1, largest)]
    for b in policy.sizes:
        cost = policy.costs.estimate(policy, b)
        v = verify(b)
        if b > limit or cost is None or v is None:
            continue
        for k in range(1, min(copied, b - 2) + 1):
            tokens = _splice_tokens(copies[:k] + drafts[k : b - 1])
            if tokens / (cost + v) > rate:
                best, rate = Plan(SPLICE, b, k), tokens / (cost + v)
    return best


def _splice_tokens(rates: list[float]) -> float:
    """Expected tokens of a block whose proposals are accepted at `rates` (each
    given the ones before it): a splice's copy ids, then the drafter's drafts."""
    reach, expected = 1.0, 1.0
    for rate in rates:
        reach *= rate
        expected += reach
    return expected
