"""Byte-bounded LRU of `PromptCache`s: a follow-up turn prefills only its new tokens.

Each request takes the cache whose tokens share the longest prefix with its prompt (or a
new one) out of the pool, so a cache has one owner at a time, and gives it back when it
is done. Only the engine thread calls it.
"""

from collections.abc import Callable, Sequence

from ..cache import PromptCache
from ..cache import _common_prefix as _shared_prefix


class PromptPool:
    """Least-recently-used conversation caches, at most `max_bytes` in total."""

    def __init__(self, make_cache: Callable[[], PromptCache], max_bytes: int):
        if max_bytes < 0:
            raise ValueError(
                f"prompt cache bytes must be >= 0 (0 turns reuse off), got {max_bytes}."
            )
        self.make_cache = make_cache
        self.max_bytes = max_bytes
        self._entries: list[tuple[PromptCache, int]] = []  # oldest first

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def nbytes(self) -> int:
        return sum(size for _, size in self._entries)

    def _usable_prefix(self, cache: PromptCache, prompt: Sequence[int]) -> int:
        n = _shared_prefix(cache.tokens, prompt)
        # caches that cannot be trimmed (recurrent layers) serve only exact extensions
        if n < len(cache.tokens) and not all(c.is_trimmable() for c in cache.target):
            return 0
        return n

    def take(self, prompt: Sequence[int]) -> PromptCache:
        """The cache sharing the longest prefix with `prompt` (taken), or a new one."""
        best, best_len = None, 0
        for i, (cache, _) in enumerate(self._entries):
            n = self._usable_prefix(cache, prompt)
            if n > best_len:
                best, best_len = i, n
        if best is None:
            return self.make_cache()
        return self._entries.pop(best)[0]

    def give_back(self, cache: PromptCache):
        """Keep `cache` as the most recent entry; drop the oldest beyond the budget."""
        if not cache.tokens:
            return
        self._entries.append((cache, cache.nbytes))
        while self._entries and self.nbytes > self.max_bytes:
            self._entries.pop(0)
