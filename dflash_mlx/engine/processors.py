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


def _at(ids: Sequence[int], last: int | None, i: int) -> int:
    return ids[i] if i < len(ids) else int(last)  # type: ignore[arg-type]
