"""Byte-bounded LRU of `PromptCache`s: a follow-up turn prefills only its new tokens.

Each request takes the cache whose tokens share the longest prefix with its prompt (or a
new one) out of the pool, so a cache has one owner at a time, and gives it back when it
is done. Only the engine thread calls it.
"""

from collections.abc import Callable, Sequence

from ..models.cache import PromptCache
from ..models.cache import _common_prefix as _shared_prefix


class PromptPool:
    """Least-recently-used conversation caches, at most `max_bytes` in total."""

    def __init__(self, make_cache: Callable[[], PromptCache], max_bytes: int):
        if max_bytes < 0:
            raise ValueError(
                f"prompt cache bytes must be >= 0 (0 turns reuse off), got {max_bytes}."
            )
        self.make_cache = make_cache
        self.max_bytes = max_bytes
        self._entries: list[tuple[PromptCache, int, int]] = []  # (cache, bytes, id)
        self._next_id = 0

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def nbytes(self) -> int:
        return sum(entry[1] for entry in self._entries)

    def _usable_prefix(self, cache: PromptCache, prompt: Sequence[int]) -> int:
        n = _shared_prefix(cache.tokens, prompt)
        # caches that cannot be trimmed (recurrent layers) serve only exact extensions
        if n < len(cache.tokens) and not all(c.is_trimmable() for c in cache.target):
            return 0
        return n

    def take(self, prompt: Sequence[int]) -> tuple[PromptCache, int | None]:
        """(the cache sharing the longest prefix with `prompt`, taken out, and its pool
        id), or (a new cache, None)."""
        best, best_len = None, 0
        for i, (cache, _, _) in enumerate(self._entries):
            n = self._usable_prefix(cache, prompt)
            if n > best_len:
                best, best_len = i, n
        if best is None:
            return self.make_cache(), None
        cache, _, pool_id = self._entries.pop(best)
        return cache, pool_id

    def give_back(self, cache: PromptCache) -> tuple[int | None, list[int]]:
        """Keep `cache` as the most recent entry and drop the oldest beyond the budget:
        (the id it is kept under or None, the ids dropped)."""
        if not cache.tokens:
            return None, []
        pool_id, self._next_id = self._next_id, self._next_id + 1
        self._entries.append((cache, cache.nbytes, pool_id))
        dropped = []
        while self._entries and self.nbytes > self.max_bytes:
            dropped.append(self._entries.pop(0)[2])
        return (None if pool_id in dropped else pool_id), dropped
