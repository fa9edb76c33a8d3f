"""Logits processors at every verified position: mlx-lm's `(tokens, logits) -> logits`
(penalties, a logit bias, a grammar's mask), applied to the target's logits before the
acceptance rule.

A processor at block position i sees the history up to it: the prompt, the committed
tokens, `last`, then the drafts before position i. The acceptance rule then reads
the processed distribution, so a draft it rules out is rejected as any other, and each
committed token is the one plain decoding with the same processors would choose (greedy)
or a draw from its distribution (sampled). Without processors nothing here runs.
"""

from collections.abc import Callable, Sequence

import mlx.core as mx

from .verify import one_hot

LogitsProcessor = Callable[[mx.array, mx.array], mx.array]


class Processors:
    """One generation's processors and its history as an array, grown as it goes."""

    def __init__(self, processors: Sequence[LogitsProcessor]):
        self.processors = tuple(processors)
        self._history = mx.array([], mx.int32)
        self._seen: list[int] = []  # the ids `_history` holds

    @classmethod
    def of(cls, processors) -> "Processors | None":
        """None for no processors (the engine then runs exactly as without)."""
        if processors is None:
            return None
        if callable(processors):
            processors = [processors]
        processors = list(processors)
        if not all(callable(p) for p in processors):
            raise ValueError(
                "logits_processors must be a list of callables (tokens, logits) -> "
                "logits, as mlx-lm's make_logits_processors returns."
            )
        return cls(processors) if processors else None

    @property
    def proposes(self) -> bool:
        """Whether a processor (a grammar) shapes the drafts (`propose`)."""
        return any(hasattr(p, "propose") for p in self.processors)

    def propose(
        self, ids: Sequence[int], last: int, drafts: list[int]
    ) -> tuple[list[int], list[bool]]:
        """`drafts` as the processors that propose would have them, and for each one
        they all allow whether one of them chose it (structured.GrammarProcessor)."""
        chosen = [False] * len(drafts)
        for processor in self.processors:
            if hasattr(processor, "propose"):
                drafts, mine = processor.propose(ids, last, drafts)
                # as long as the shorter: past it, one of them forbids the draft
                chosen = [a or b for a, b in zip(chosen, mine, strict=False)]
        return drafts, chosen

    def shape(
        self, ids: Sequence[int], last: int, drafts: list[int], q: mx.array | None
    ) -> tuple[list[int], list[bool], mx.array | None]:
        """`propose`, and the drafts' q (None: deterministic drafts) one-hot where a
        processor replaced a draft."""
        after, chosen = self.propose(ids, last, drafts)
        changed = [i for i in range(len(chosen)) if after[i] != drafts[i]]
        if q is not None and changed:
            at = mx.array(changed)
            q = mx.array(q)  # a copy: the caller's q stays as it was
            q[at] = one_hot(mx.array(after)[at], q.shape[-1])
        return after, chosen, q

    def history(self, ids: Sequence[int], last: int | None = None) -> mx.array:
        """`ids` then `last` (the generation's tokens so far: they only grow) as an
        int32 array; only the ids new since the last call are copied."""
        n, total = len(self._seen), len(ids) + (last is not None)
        if total < n or (n and _at(ids, last, n - 1) != self._seen[-1]):
            self._history, self._seen, n = mx.array([], mx.int32), [], 0
        if total > n:
            new = [_at(ids, last, i) for i in range(n, total)]
            self._history = mx.concatenate([self._history, mx.array(new, mx.int32)])
            self._seen.extend(new)
        return self._history

    def apply(
        self, ids: Sequence[int], last: int | None, logits: mx.array, drafts=None
    ) -> mx.array:
        """`logits` (n + 1, V) of a block that verifies `drafts` (n,) after `ids` and
        `last`, each row processed with the history up to its position."""
        history = self.history(ids, last)
        rows = []
        for i in range(logits.shape[0]):
            tokens = history
            if i:
                tokens = mx.concatenate([history, drafts[:i].astype(mx.int32)])
            row = logits[i : i + 1]
            for processor in self.processors:
                row = processor(tokens, row)
            rows.append(row)
        return rows[0] if len(rows) == 1 else mx.concatenate(rows, axis=0)


def proposing(processors: Processors | None) -> bool:
    """Whether `processors` shape the drafts (a grammar among them)."""
    return processors is not None and processors.proposes


def _at(ids: Sequence[int], last: int | None, i: int) -> int:
    return ids[i] if i < len(ids) else int(last)  # type: ignore[arg-type]
