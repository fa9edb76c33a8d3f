"""Caches of several sequences at once, for verifying their blocks in one forward.

A `RaggedKVCache` stands in for one attention layer's `KVCache` of each sequence of a
batch: row b holds that sequence's keys and values in columns 0 .. length_b - 1, at
absolute positions base_b .. base_b + length_b - 1. Rows differ in length, and a
verify step may keep a different number of its tokens in each row, so writes are
provisional: `update_and_fetch` writes a block's keys after each row's own length
(the model's rotary offsets and the mask follow each row), and only `commit` says how
many of them each row keeps. Rejected keys are simply never committed: a rollback
moves no data. mlx-lm's models read it as any cache (`offset`, `update_and_fetch`,
`make_mask`); recurrent layers use mlx-lm's own batched `ArraysCache`.
"""

from collections.abc import Sequence
from functools import lru_cache

import mlx.core as mx
from mlx_lm.models.cache import ArraysCache, KVCache

from .sliding_cache import SlidingKVCache

STEP = 256  # columns added when a row outgrows the storage


@lru_cache(maxsize=4)
def _columns(lengths: tuple[int, ...], shape: tuple[int, ...]) -> mx.array:
    """Where a block of shape (B, H, T, D) goes in each row's storage: columns
    lengths[b] + t, as put_along_axis indices. Every layer of a step writes at the
    same columns: built once a step, not once a layer (7 ops, 210 of the ~1,080 of a
    plain step of the built-in target)."""
    T = shape[2]
    at = mx.array(lengths)[:, None] + mx.arange(T)[None]  # (B, T)
    return mx.broadcast_to(at[:, None, :, None], shape)


class RaggedKVCache:
    """One layer's keys and values for a batch of sequences of different lengths."""

    def __init__(self, rows: int):
        self.keys: mx.array | None = None
        self.values: mx.array | None = None
        self.lengths = [0] * rows  # committed columns per row
        self.bases = [0] * rows  # absolute position of column 0 per row

    # -- what mlx-lm's models read ------------------------------------------------
    @property
    def positions(self) -> tuple[int, ...]:
        """Each row's next absolute position (where its block starts)."""
        return tuple(b + n for b, n in zip(self.bases, self.lengths, strict=True))

    @property
    def offset(self) -> mx.array:
        """`positions` as an array: the rotary offsets of the block, per row."""
        return mx.array(self.positions)

    def visible(self, T: int) -> tuple[int, ...]:
        """Keys each row's block sees: its committed ones and the block's T."""
        return tuple(n + T for n in self.lengths)

    def update_and_fetch(self, keys: mx.array, values: mx.array):
        """Write a block's keys and values after each row's length; every row's keys
        and values up to the longest (the mask hides what a row does not see)."""
        T = keys.shape[2]
        width = max(self.lengths) + T
        stored_keys, stored_values = self._reserve(width, keys, values)
        lengths = tuple(self.lengths)
        at_keys = _columns(lengths, tuple(keys.shape))
        at_values = _columns(lengths, tuple(values.shape))  # the same, as a rule
        self.keys = mx.put_along_axis(stored_keys, at_keys, keys, 2)
        self.values = mx.put_along_axis(stored_values, at_values, values, 2)
        return self.keys[..., :width, :], self.values[..., :width, :]

    def make_mask(self, N: int, return_array: bool = False, window_size=None, **_):
        """(B, 1, N, width) booleans: query t of row b sees its row's committed keys
        and the block's keys up to its own (and, with a window, no further back)."""
        return self.block_mask(N, causal=True, window=window_size)

    def block_mask(self, N: int, causal: bool = True, window: int | None = None):
        width = max(self.lengths) + N
        column = mx.arange(width)[None, None, :]
        lengths = mx.array(self.lengths)[:, None, None]
        query = lengths + mx.arange(N)[None, :, None]  # each query's own column
        visible = column <= query if causal else column < lengths + N
        if window is not None:
            visible = visible & (column > query - window)
        return visible[:, None]

    @property
    def state(self):
        return [] if self.keys is None else [self.keys, self.values]

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.state)

    def is_trimmable(self) -> bool:
        return True

    def size(self) -> int:
        return max(self.lengths, default=0)

    def trim(self, n: int) -> int:
        """Uncommitted keys are dropped by not committing them: nothing to do."""
        return 0

    # -- the batch's own moves ----------------------------------------------------
    def commit(self, counts: Sequence[int]):
        """Keep the first counts[b] keys of the last block written in row b."""
        self.lengths = [n + c for n, c in zip(self.lengths, counts, strict=True)]

    def _reserve(self, width: int, keys: mx.array, values: mx.array) -> tuple:
        """The storage, with room for `width` columns in every row (heads shaped
        like `keys` and `values`)."""
        B, (_, H, _, Dk) = len(self.lengths), keys.shape
        if self.keys is None or self.values is None:
            self.keys = mx.zeros((B, H, 0, Dk), keys.dtype)
            self.values = mx.zeros((B, H, 0, values.shape[3]), values.dtype)
        have = self.keys.shape[2]
        if width > have:
            grow = -(-(width - have) // STEP) * STEP
            new_k = mx.zeros((B, H, grow, Dk), keys.dtype)
            new_v = mx.zeros((B, H, grow, values.shape[3]), values.dtype)
            self.keys = mx.concatenate([self.keys, new_k], axis=2)
            self.values = mx.concatenate([self.values, new_v], axis=2)
        return self.keys, self.values

    def put_row(self, row: int, cache) -> None:
        """Make row `row` hold `cache`'s keys (a KVCache, or a drafter's windowed one:
        its keys then start at its first kept position)."""
        keys, values = _kept(cache)
        size = 0 if keys is None else keys.shape[2]
        self.bases[row] = cache.offset - size
        self.lengths[row] = size
        if keys is None:
            return
        if self.keys is None and len(self.lengths) == 1 and type(cache) is KVCache:
            # a batch's only row: its storage is the cache's own (with its room),
            # not a copy of the whole history
            self.keys, self.values = cache.keys, cache.values
            return
        stored_keys, stored_values = self._reserve(size, keys, values)
        stored_keys[row : row + 1, :, :size] = keys
        stored_values[row : row + 1, :, :size] = values

    def take_row(self, row: int, share: bool = False) -> KVCache:
        """Row `row` as a KVCache of its own: a copy, or with `share` (and a row
        from position 0) a view of the storage with its room (a row is contiguous;
        the batch's next write copies the storage if the view is still held)."""
        cache = KVCache()
        n = self.lengths[row]
        if n and self.keys is not None and self.values is not None:
            if share and self.bases[row] == 0:
                cache.keys = self.keys[row : row + 1]
                cache.values = self.values[row : row + 1]
            else:
                cache.keys = mx.contiguous(self.keys[row : row + 1, :, :n])
                cache.values = mx.contiguous(self.values[row : row + 1, :, :n])
            cache.offset = self.bases[row] + n
        return cache

    def clear_row(self, row: int):
        self.lengths[row], self.bases[row] = 0, 0

    def add_rows(self, n: int):
        """n more (empty) rows at the end."""
        if self.keys is not None and self.values is not None:
            pad = [(0, n), (0, 0), (0, 0), (0, 0)]
            self.keys, self.values = mx.pad(self.keys, pad), mx.pad(self.values, pad)
        self.lengths += [0] * n
        self.bases += [0] * n

    def keep_rows(self, rows: Sequence[int]):
        """Only these rows, in this order (a copy of their keys)."""
        if self.keys is not None and self.values is not None:
            index = mx.array(list(rows))
            width = max((self.lengths[r] for r in rows), default=0)
            self.keys = self.keys[index, :, :width]
            self.values = self.values[index, :, :width]
        self.lengths = [self.lengths[r] for r in rows]
        self.bases = [self.bases[r] for r in rows]


def _whole(cache):
    """A batch row holds every position of a sequence: no bounded window caches."""
    if any(isinstance(c, SlidingKVCache) for c in cache.target):
        raise ValueError(
            "A batch's rows keep whole histories: make the sequence's caches with "
            "make_prompt_cache(..., windows=False)."
        )


def _kept(cache) -> tuple:
    """(keys, values) a single sequence's cache holds, (None, None) when empty."""
    if hasattr(cache, "kept"):  # a drafter's windowed cache
        return cache.kept()
    if cache.keys is None or cache.offset == 0:
        return None, None
    return cache.keys_and_values()


def _put_state_row(batch: ArraysCache, row: int, solo: ArraysCache, rows: int):
    for i, a in enumerate(solo.cache):
        if a is None:
            continue
        if batch.cache[i] is None:
            batch.cache[i] = mx.zeros((rows,) + a.shape[1:], a.dtype)
        batch.cache[i][row : row + 1] = a


class BatchCaches:
    """A target's and its drafter's caches with one row per sequence of a batch:
    `RaggedKVCache`s for attention layers, mlx-lm's batched `ArraysCache`s for
    recurrent ones."""

    def __init__(self, target, draft):
        self.target = [_batch_cache(c) for c in target.make_cache()]
        self.draft = None
        if draft is not None:
            self.draft = [RaggedKVCache(0) for _ in draft.make_cache()]
        self.rows = 0

    @staticmethod
    def supports(target, caches=None) -> str | None:
        """None if a target's caches (`caches`, default its float ones) can be
        batched, else what stops it (a QuantizedKVCache among them, for one)."""
        caches = target.make_cache() if caches is None else caches
        kinds = {type(c).__name__ for c in caches if c is not None}
        odd = kinds - {"KVCache", "ArraysCache"}
        return f"its {', '.join(sorted(odd))} caches" if odd else None

    @property
    def nbytes(self) -> int:
        caches = self.target + (self.draft or [])
        return sum(c.nbytes for c in caches if c is not None)

    def add_rows(self, n: int):
        self.rows += n
        for c in self.target + (self.draft or []):
            if isinstance(c, RaggedKVCache):
                c.add_rows(n)
            elif isinstance(c, ArraysCache):
                c.cache = [
                    None if a is None else mx.pad(a, [(0, n)] + [(0, 0)] * (a.ndim - 1))
                    for a in c.cache
                ]

    def keep_rows(self, rows: Sequence[int]):
        index = mx.array(list(rows))
        for c in self.target + (self.draft or []):
            if isinstance(c, RaggedKVCache):
                c.keep_rows(rows)
            elif isinstance(c, ArraysCache):
                c.cache = [None if a is None else a[index] for a in c.cache]
        self.rows = len(rows)

    def put(self, row: int, cache) -> None:
        """Make `row` hold a PromptCache's caches (the sequence it serves joins)."""
        _whole(cache)
        pairs = list(zip(self.target, cache.target, strict=True))
        pairs += list(zip(self.draft or [], cache.draft or [], strict=True))
        for mine, solo in pairs:
            if isinstance(mine, RaggedKVCache):
                mine.put_row(row, solo)
            elif isinstance(mine, ArraysCache):
                _put_state_row(mine, row, solo, self.rows)

    def take(self, row: int, into) -> None:
        """Give a fresh PromptCache `into` the caches of `row` (the sequence leaves);
        its KV layers share the batch's storage."""
        _whole(into)
        pairs = list(zip(self.target, into.target, strict=True))
        pairs += list(zip(self.draft or [], into.draft or [], strict=True))
        for mine, solo in pairs:
            if isinstance(mine, RaggedKVCache):
                _fill(solo, mine.take_row(row, share=type(solo) is KVCache))
            elif isinstance(mine, ArraysCache):
                solo.cache = [
                    None if a is None else mx.contiguous(a[row : row + 1])
                    for a in mine.cache
                ]
            if isinstance(mine, RaggedKVCache):
                mine.clear_row(row)


def _batch_cache(cache):
    if cache is None:
        return None
    if isinstance(cache, ArraysCache):
        return ArraysCache(len(cache.cache))
    return RaggedKVCache(0)


def _fill(solo, row: KVCache):
    """Give a fresh KVCache (or drafter window cache) the keys of `row`."""
    if row.keys is None:
        return
    if hasattr(solo, "restore"):  # a drafter's windowed cache
        solo.restore(row.keys, row.values, row.offset)
    else:
        solo.keys, solo.values, solo.offset = row.keys, row.values, row.offset
