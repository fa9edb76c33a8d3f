"""Choosing the verify block size from what this machine and this drafter actually do.

A block of size B costs t(B) seconds (one draft forward + one target forward over B
tokens; B = 1 is plain decoding, no drafter) and commits E(B) tokens on average, where
E(B) = 1 + sum_{j<B} prod_{k<=j} alpha_k and alpha_k is the rate at which the k-th draft
is accepted given the ones before it were. The policy measures both as it goes and picks
the B with the most tokens per second, so a slow machine or a weak drafter falls back to
plain decoding instead of running slower than it. Any B is lossless.

Within a block it also decides how many drafts to verify (`cut`): draft k is verified
when its expected tokens (the product of the drafter's confidences up to k) pay for its
share of v(T), the measured cost of verifying T tokens, at the current rate: where v
grows with T (CPUs) hopeless drafts are skipped, where it is flat (GPUs) none. t(B) and
E(B) are both taken with the cut; the drafts it dropped count in alpha at the drafter's
confidence, so a cut that hides weak drafts cannot keep a losing size alive.

Acceptance changes with the text (a code answer after a math one, a new chat topic), so
the counts behind alpha_k are weighted by age: a block `memory` blocks old counts e^-1
as much as the latest one. Losing explorations back off (to every `MAX_EXPLORE_GAP`
blocks, more when they lost by far), so a policy that stopped drafting on hard text
finds out when drafting pays again.

A fresh policy need not explore from scratch: the drafter's shipped per-position
acceptance (`draft.acceptance_prior`, see models/acceptance.py) enters as pseudo-counts
worth `prior_blocks` blocks, which real observations outweigh after as many blocks; and
`calibrate.py` times each block size and verify size during the load-time warm-up, so
every size starts timed (stored times are rescaled by the first verify this process
measures: they may come from a busier moment). Without either, each acceptance starts
at one optimistic pseudo-observation and each size is tried once.

With prompt lookup (lookup.py), `plan` also weighs copying from the history, alone or
spliced before the drafts, against `next`'s block (sources.py); `observe(source=...)`
counts each source apart. docs/policy.md has the whole picture.
"""

import copy

from ..models.acceptance import pseudo_counts
from .sources import (
    DRAFT,
    LOOKUP,
    LOOKUP_PRIOR_FLOOR,
    TIME_OUTLIER,
    Costs,
    FixedBlockSize,
    LookupStats,
    choose,
    interpolated,
)
from .sources import verify_estimate as _verify_estimate

# the block-size policies (FixedBlockSize lives beside fixed_plan in sources.py)
__all__ = ["AdaptiveBlockSize", "FixedBlockSize"]

PRIOR_BLOCKS = 16.0  # the shipped acceptance counts as this many observed blocks
EXPLORE_BLOCKS = 2  # an exploration runs this many blocks: one block says little
# Acceptance counts are weighted over about this many blocks (about one answer): in a
# simulated code answer after 4,000 gsm8k tokens with cumulative counts, the policy kept
# drafting; in the reverse, it never drafted again (tests/test_policy_start.py).
MEMORY_BLOCKS = 128.0
MAX_EXPLORE_GAP = 128  # blocks; the gap doubles after each losing exploration
# ... or this many per unit of its loss (time lost per block against the best size's,
# as a batch's wide verify on a CPU): explorations then cost about 1%
LOSS_GAP = 2 * EXPLORE_BLOCKS * 100
MAX_LOOKUP = 15  # copied ids per block: 16 verified tokens, one native product
# A cut saves at most v's growth over the block: where that is under this share of
# the block's time (v flat, as on a GPU), it cannot pay for its sync and is skipped.
FLAT_VERIFY = 0.1
# Timings depend on the rows verified together (a batch's width), acceptance not.
_TIMINGS = "seconds verify_seconds _timed_here costs _tokens _block_seconds".split()


class AdaptiveBlockSize:
    """Picks block sizes among the powers of two below `max_size`, and `max_size`.

    `prior` (an `acceptance.Acceptance`) seeds the per-position acceptance with
    pseudo-counts worth `prior_blocks` blocks; `memory` is how many blocks the counts
    remember (math.inf: all of them, as a stationary text would want); `max_lookup`
    caps the ids a lookup block copies."""

    def __init__(
        self,
        max_size: int,
        explore_every: int = 24,
        smoothing: float = 0.3,
        prior=None,
        prior_blocks: float = PRIOR_BLOCKS,
        memory: float = MEMORY_BLOCKS,
        max_lookup: int = MAX_LOOKUP,
    ):
        if max_size < 1:
            raise ValueError(f"max block size must be >= 1, got {max_size}.")
        if not memory >= 1:
            raise ValueError(f"memory must be at least 1 block, got {memory}.")
        self.sizes = sorted(
            {1, max_size} | {s for s in (2, 4, 8, 16, 32) if s < max_size}
        )
        self.explore_every = explore_every
        self.smoothing = smoothing
        self.accepted = [0.0] * max_size  # accepted[k]: draft k+1 accepted
        self.offered = [0.0] * max_size  # offered[k]: draft k+1 verified, k accepted
        self.prior_accepted, self.prior_offered = pseudo_counts(
            prior, max_size, prior_blocks
        )
        # each block ages the counts by `_keep` (memory=inf: never); the prior ages
        # too, down to the weight of one block
        self._keep = 1.0 - 1.0 / memory
        self._prior_weight = 1.0
        self._prior_floor = min(1.0, 1.0 / prior_blocks) if prior_blocks > 0 else 1.0
        self.seconds: dict[int, float] = {}  # t(B): wall time of a block of size B
        self.verify_seconds: dict[int, float] = {}  # v(T): verifying T tokens
        # the sizes timed in this process, per table (see `_time`: a stored verify
        # time, from another moment, is replaced by the first measured here)
        self._timed_here: dict[str, set[int]] = {"block": set(), "verify": set()}
        self.blocks = 0
        self._explore_next = 0
        self._gap = explore_every  # blocks to the next exploration; doubles on a loss
        self._explored: int | None = None
        self._explore_left = 0  # blocks left in the current exploration
        self._tokens: float | None = None  # committed tokens per block, smoothed
        self._block_seconds: float | None = None  # seconds per block, smoothed
        # per size, the expected extra tokens of the drafts (all; kept by the cut),
        # from the drafter's confidences, smoothed
        self._drafted_worth: dict[int, float] = {}
        self._kept_worth: dict[int, float] = {}
        self._confidence: list | None = None  # the last cut's, for its observe
        self._run: set[int] = set()  # sizes this policy has run real blocks at
        self.max_lookup = max_lookup
        self.lookup = LookupStats(max_lookup)  # the copies' acceptance (sources.py)
        self.costs = Costs(smoothing)  # each kind of block's time beside its verify
        self.width = 1  # sequences verified together (`at_width`)
        self._widths: dict[int, dict] = {}  # the other widths' timings

    @classmethod
    def for_drafter(cls, draft, **kwargs) -> "AdaptiveBlockSize":
        """A policy up to `draft`'s block size, starting from its shipped acceptance."""
        prior = getattr(draft, "acceptance_prior", None)
        return cls(draft.args.block_size, prior=prior, **kwargs)

    def acceptance(self, k: int) -> float:
        """Estimated P(draft k accepted | drafts 1..k-1 accepted), k >= 1."""
        w = self._prior_weight
        accepted = self.accepted[k - 1] + w * self.prior_accepted[k - 1]
        return accepted / (self.offered[k - 1] + w * self.prior_offered[k - 1])

    def expected_tokens(self, size: int) -> float:
        total, run = 1.0, 1.0
        for k in range(1, size):
            run *= self.acceptance(k)
            total += run
        return total

    def block_tokens(self, size: int) -> float:
        """Tokens a block of `size` commits as this policy runs it, its cut included:
        1 + (E(size) - 1) x the share of the expected extra tokens the cut keeps there
        (from the drafter's confidences, so t(B), measured with the cut, and the tokens
        it buys stay consistent)."""
        return 1.0 + (self.expected_tokens(size) - 1.0) * self.kept_share(size)

    def kept_share(self, size: int) -> float:
        """The share of its drafts' expected tokens the cut keeps at `size` (1: all)."""
        drafted = self._drafted_worth.get(size)
        return self._kept_worth[size] / drafted if drafted else 1.0

    def rate(self, size: int) -> float | None:
        """Expected tokens per second at `size`, or None before it has been timed."""
        t = self.seconds.get(size)
        return None if t is None else self.block_tokens(size) / t

    def next(self, limit: int | None = None) -> int:
        """The block size to use next (never above `limit`)."""
        sizes = [s for s in self.sizes if limit is None or s <= limit] or [1]
        # each size once, largest first: calibrated timings say what a block costs
        # uncut, not what this drafter's cut makes of it here
        untried = [s for s in sizes if s not in self._run]
        if untried:
            return untried[-1]
        if self._explored in sizes and self._explore_left > 0:
            return self._explored
        best = max(sizes, key=lambda s: self.rate(s) or 0.0)  # all timed by now
        if self._gap and self.blocks >= self._gap:
            # re-time another size now and then: speed and acceptance drift with context
            self._explore_next = (self._explore_next + 1) % len(sizes)
            explored = sizes[self._explore_next]
            if explored != best:
                self._explored, self.blocks = explored, 0
                self._explore_left = EXPLORE_BLOCKS
                return explored
        return best

    @property
    def exploring(self) -> int | None:  # the size being re-timed now, if any
        return self._explored

    def at_width(self, width: int):
        """Time the next blocks as `width` sequences verified together: each width
        keeps its own timings (a new one starts from the nearest width's and is
        re-timed as it runs); the acceptance is shared."""
        if width == self.width:
            return
        self._widths[self.width] = {k: getattr(self, k) for k in _TIMINGS}
        timings = self._widths.pop(width, None)
        if timings is None:
            nearest = min(self._widths, key=lambda w: (abs(w - width), w))
            timings = copy.deepcopy(self._widths[nearest])
        for name, value in timings.items():
            setattr(self, name, value)
        self.width = width

    def plan(self, limit: int, copied: int, match: int = 0, drafter: bool = True):
        """The next block when prompt lookup offers `copied` ids after a `match`-gram
        match: the drafter's (`next`), the copy's, or a splice (sources.choose)."""
        return choose(self, limit, copied, match, drafter)

    def _after_exploring(self, size: int):
        rates = {s: self.rate(s) or 0.0 for s in self.sizes if s in self.seconds}
        best = max(rates, key=lambda s: rates[s])
        loss = rates[best] / rates[size] - 1.0 if rates.get(size) else 0.0
        longest = max(MAX_EXPLORE_GAP, self.explore_every, int(LOSS_GAP * loss))
        self._gap = self.explore_every if size == best else min(self._gap * 2, longest)
        self._explored = None

    def observe(
        self,
        size: int,
        n_accepted: int,
        seconds: float,
        verified: int | None = None,
        verify_seconds: float | None = None,
        confidence: list | None = None,
        source: int = DRAFT,
        match: int = 0,
        copied: int = 0,
        step: bool = True,
    ):
        """Record a block: size drafted, drafts accepted, wall time, and (when the block
        was cut) how many tokens the target verified, how long that took, and the
        drafter's confidences (default: those the last `cut` saw). A lookup or splice
        block (`source`) gives its copy's length and match instead. `step=False`: a
        block of a batch step already observed (engine/batch.py), whose time and turn
        in the exploration schedule it shares: only its acceptance counts."""
        verified = size if verified is None else verified
        if step:
            self.costs.observe(1 if source == LOOKUP else size, seconds, verify_seconds)
        if source != DRAFT:
            self._observe_copy(n_accepted, seconds, verified, verify_seconds, step)
            self.lookup.count(match, copied, n_accepted)
            return
        if confidence is not None:
            self._confidence = list(confidence)
        self.blocks += step
        self._run.add(size)
        self._age_counts()
        for k in range(min(n_accepted + 1, verified - 1)):
            self.offered[k] += 1
            if k < n_accepted:
                self.accepted[k] += 1
        if self._confidence is not None and len(self._confidence) == size - 1:
            self._count_cut(self._confidence, size, verified, n_accepted)
        self._confidence = None
        self._tokens = self._smooth(self._tokens, n_accepted + 1)
        if not step:
            return
        if verify_seconds is not None:  # first: it may rescale stored block times
            self._time("verify", self.verify_seconds, verified, verify_seconds)
        self._time("block", self.seconds, size, seconds)
        self._block_seconds = self._smooth(self._block_seconds, seconds)
        if size == self._explored:
            self._explore_left -= 1
            if self._explore_left <= 0:
                self._after_exploring(size)

    def _observe_copy(self, n_accepted, seconds, verified, verify_seconds, step):
        """A lookup or splice block: it ages the counts and times v(T), but says
        nothing of the drafter's acceptance or of t(B)."""
        self.blocks += step
        self._age_counts()
        self._confidence = None
        self._tokens = self._smooth(self._tokens, n_accepted + 1)
        if not step:
            return
        if verify_seconds is not None:
            self._time("verify", self.verify_seconds, verified, verify_seconds)
        self._block_seconds = self._smooth(self._block_seconds, seconds)

    def _age_counts(self):
        keep = self._keep
        self.lookup.age(keep, LOOKUP_PRIOR_FLOOR)
        if keep < 1.0:
            self.accepted = [a * keep for a in self.accepted]
            self.offered = [o * keep for o in self.offered]
            self._prior_weight = max(self._prior_weight * keep, self._prior_floor)

    def _count_cut(self, confidence: list, size: int, verified: int, n_accepted: int):
        """What the cut did to this block, from the confidences it saw: the share of
        expected extra tokens it kept, and the drafts it dropped counted at the
        drafter's confidence (expected counts; else a weak drafter's dropped drafts
        would leave its acceptance at the prior forever)."""
        reach, expected = 1.0, [0.0]
        for c in confidence:
            reach *= c
            expected.append(expected[-1] + reach)
        first = expected[-1]  # one pseudo-block like this one that kept all
        for worth, value in (
            (self._drafted_worth, expected[-1]),
            (self._kept_worth, expected[verified - 1]),
        ):  # sums, not a mean of ratios: a block with more at stake weighs more
            worth[size] = self._smooth(worth.get(size, first), value)
        if n_accepted < verified - 1:
            return  # a draft was rejected: nothing past it would have counted
        reach = 1.0
        for k in range(verified - 1, size - 1):
            self.offered[k] += reach
            self.accepted[k] += reach * confidence[k]
            reach *= confidence[k]

    def _smooth(self, old: float | None, new: float) -> float:
        return new if old is None else old + self.smoothing * (new - old)

    def _time(self, kind: str, table: dict[int, float], size: int, seconds: float):
        """Update t or v at `size` with a block's measurement: smoothed once timed in
        this process, else replacing the stored (calibrated) time. The first v(T)
        measured here also scales the stored times not yet measured here by its
        ratio: they came from another moment (a busier machine, older code), and a v
        too high for a size the cut then never verified would never be measured
        again. (A first t(B) says less: it is timed with the cut, calibrated
        without.)"""
        old = table.get(size)
        if old is None and kind == "verify":
            old = self.verify_cost(size)  # interpolated between stored sizes
            if old is not None and size > max(table):  # a copy longer than any
                old = _verify_estimate(table, size)
        if old is not None:
            seconds = min(seconds, old * TIME_OUTLIER)
        here = self._timed_here[kind]
        if size in here or kind == "block":
            # a verify far faster than its stored time replaces it: that time was a
            # slow outlier (a first run compiling kernels), which smoothing would
            # keep for many blocks (a block's t(B) varies with its cut: smoothed)
            stale = kind == "verify" and old and seconds * TIME_OUTLIER < old
            table[size] = seconds if stale else self._smooth(old, seconds)
            here.add(size)
            return
        table[size] = seconds
        here.add(size)
        if old:
            pace = seconds / old
            tables = (("block", self.seconds), ("verify", self.verify_seconds))
            for name, times in tables:
                for k in times:
                    if k not in self._timed_here[name]:
                        times[k] *= pace

    @property
    def tokens_rate(self) -> float | None:
        """Recent committed tokens per second (the rate a cut must beat)."""
        if self._tokens is None or not self._block_seconds:
            # nothing observed yet: the best rate the timings (calibrated) promise
            rates = [r for r in map(self.rate, self.sizes) if r is not None]
            return max(rates, default=None)
        return self._tokens / self._block_seconds

    def verify_cost(self, tokens: int) -> float | None:
        """v(T) interpolated between measured sizes (flat beyond); None if unknown."""
        return interpolated(self.verify_seconds, tokens)

    def cut_may_drop(self, size: int) -> bool:
        """Whether `cut` is worth its sync at `size`: only where v(T) is measured and
        grows over the block by more than `FLAT_VERIFY` of its time. Elsewhere every
        draft is verified without asking (where v is unmeasured, `cut` keeps all)."""
        measured = [self.verify_cost(t) for t in range(1, size + 1)]
        costs = [c for c in measured if c is not None]
        if size < 2 or self.tokens_rate is None or len(costs) < size:
            return False
        block = self.seconds.get(size, max(costs))  # untimed: v itself
        return max(costs) - min(costs) > FLAT_VERIFY * block

    def cut(self, confidence: list) -> int:
        """How many of the drafts (with the drafter's probabilities `confidence`) to
        verify.

        Maximises expected tokens − rate × v(1 + k): verifying more pays only if the
        drafts are likely enough to be accepted. Until v and the rate are measured, all.
        """
        n = len(confidence)
        self._confidence = list(confidence)
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
