"""Target + drafter caches that persist across calls (multi-turn chat reuse), and the
drafter's context cache with a window (`WindowedKVCache`)."""

from collections.abc import Sequence

import mlx.core as mx
from mlx.utils import tree_flatten

from .target import Target


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


class PromptCache:
    """KV/recurrent caches of a target and its drafter, and the token ids they hold.

    Between generations both caches cover the same tokens: every committed token except
    the last, whose features the target has not computed yet. (Within one, the drafter's
    may lag behind by the plain blocks since its last draft: engine/loop.py.)
    """

    def __init__(
        self,
        target: Target,
        draft=None,
        kv_bits: int | None = None,
        kv_group_size: int = 64,
        windows: bool = True,
    ):
        self.target_model = target.model
        self.draft_model = draft
        # the target's attention caches quantized (Target.make_cache), or None
        self.kv_bits, self.kv_group_size = kv_bits, kv_group_size
        # bounded caches for sliding-window layers (Target.make_cache)
        self.windows = windows
        self._owner: object | None = None
        self.reset(target)

    def claim(self, owner: object):
        """Make `owner` (one live generation) the only user of these caches."""
        if self._owner is not None and self._owner is not owner:
            raise ValueError(
                "This prompt cache is in use by another generation that has not "
                "finished: finish or close() that generator first, or give each "
                "concurrent generation its own cache (make_prompt_cache)."
            )
        self._owner = owner

    def release(self, owner: object):
        if self._owner is owner:
            self._owner = None

    @property
    def in_use(self) -> bool:
        return self._owner is not None

    @property
    def nbytes(self) -> int:
        """Memory held by the target's and the drafter's caches."""
        arrays = dict(tree_flatten([c.state for c in self.target + (self.draft or [])]))
        return sum(a.nbytes for a in arrays.values() if isinstance(a, mx.array))

    def reset(self, target: Target):
        self.target = target.make_cache(self.kv_bits, self.kv_group_size, self.windows)
        self.draft = (
            self.draft_model.make_cache() if self.draft_model is not None else None
        )
        self.tokens: list[int] = []

    def fits(self, target: Target, draft) -> bool:
        return self.target_model is target.model and self.draft_model is draft

    def quantized_as(self, kv_bits: int | None, kv_group_size: int) -> bool:
        """Whether the target's caches are quantized as asked (kv_bits None: float)."""
        if kv_bits is None:
            return self.kv_bits is None
        return (self.kv_bits, self.kv_group_size) == (kv_bits, kv_group_size)

    def _trimmable(self, n: int) -> bool:
        def can(c) -> bool:
            by = getattr(c, "trimmable_by", None)
            return c.is_trimmable() if by is None else by(n)

        return all(can(c) for c in self.target)

    def reuse(self, target: Target, prompt: Sequence[int]) -> int:
        """Keep the longest cached prefix of `prompt` (at least one token stays new)."""
        keep = min(_common_prefix(self.tokens, prompt), len(prompt) - 1)
        drop = len(self.tokens) - keep
        if drop > 0:
            if not self._trimmable(drop):
                self.reset(target)
                return 0
            for c in self.target + (self.draft or []):
                c.trim(drop)
            del self.tokens[keep:]
        return keep


class WindowedKVCache:
    """Context KV cache that keeps only the latest `window` positions (RoPE stays
    absolute).

    Appends are cheap concatenations; the window is enforced when context is absorbed,
    so a block's own keys (appended, then trimmed) never evict context.
    """

    def __init__(self, window: int):
        self.window = window
        self.keys = self.values = None
        self.offset = 0  # absolute position of the next key
        self._size = 0  # keys currently held

    def update_and_fetch(self, keys, values):
        if self.keys is None:
            self.keys, self.values = keys, values
        else:
            self.keys = mx.concatenate([self.keys[..., : self._size, :], keys], axis=2)
            self.values = mx.concatenate(
                [self.values[..., : self._size, :], values], axis=2
            )
        self._size += keys.shape[2]
        self.offset += keys.shape[2]
        return self.keys, self.values

    def skip(self, n: int):
        """Positions that will never be read: counted, not kept (whatever this cache
        held is older still, and goes once `window` new positions come)."""
        self.offset += n

    def evict(self):
        if self._size > self.window:
            self.keys = self.keys[..., self._size - self.window : self._size, :]
            self.values = self.values[..., self._size - self.window : self._size, :]
            self._size = self.window

    def size(self) -> int:
        return self._size

    def trim(self, n: int) -> int:
        # Context evicted earlier cannot come back; the drafter then sees less of it,
        # which only affects its proposals, never the output.
        n = min(n, self.offset)
        self.offset -= n
        self._size = max(self._size - n, 0)
        return n

    def is_trimmable(self) -> bool:
        return True

    @property
    def state(self):
        return [] if self.keys is None else [self.keys, self.values]

    def kept(self) -> tuple:
        """(keys, values) of the positions held now (None, None when empty)."""
        if self.keys is None or self._size == 0:
            return None, None
        return self.keys[..., : self._size, :], self.values[..., : self._size, :]

    def restore(self, keys, values, offset: int):
        """Hold `keys`/`values`: the positions just before `offset`."""
        self.keys, self.values, self.offset = keys, values, offset
        self._size = 0 if keys is None else keys.shape[2]
