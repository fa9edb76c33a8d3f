"""The KV cache of a target's sliding-window attention layer, bounded and rollback-able.

mlx-lm gives such a layer a `RotatingKVCache`, which overwrites its oldest keys in place
and so cannot take back a rejected block. This cache keeps the last `window - 1`
positions before each forward, and as many older ones as bring what it holds after the
forward to `window - 1 + slack`, plus that forward's own keys: a verify block can always
be trimmed (the keys it appended sit at the end), and so can `slack` positions. A long
prefill chunk (more than `slack` tokens) brings its own slack, so the layer then holds
what mlx-lm's `RotatingKVCache` holds. Its attention reads a bounded number of keys at
any context length.
"""

import mlx.core as mx

# Older positions kept beyond the window: what a chat's next prompt may re-render of the
# previous answer (PromptCache.reuse) without a fresh prefill.
DEFAULT_SLACK = 256


class SlidingKVCache:
    def __init__(self, window: int, slack: int = DEFAULT_SLACK):
        self.window, self.slack = window, slack
        self.keys = self.values = None
        self.offset = 0  # absolute position of the next key
        self._size = 0  # positions held, the latest ones

    def _held(self, new: int) -> int:
        """Positions a forward of `new` tokens reads besides its own (the rest are
        evicted)."""
        return min(self._size, self.window - 1 + max(self.slack - new, 0))

    def update_and_fetch(self, keys, values):
        held = self._held(keys.shape[2])
        if self.keys is None:
            self.keys, self.values = keys, values
        else:
            start = self._size - held
            self.keys = mx.concatenate(
                [self.keys[..., start : self._size, :], keys], axis=2
            )
            self.values = mx.concatenate(
                [self.values[..., start : self._size, :], values], axis=2
            )
        self._size = held + keys.shape[2]
        self.offset += keys.shape[2]
        return self.keys, self.values

    def make_mask(self, N: int, window_size: int | None = None, return_array=False):
        """Query i (position offset + i) reads the keys of positions within the window
        before it, counted over the held keys and the N new ones."""
        window = window_size or self.window
        held = self._held(N)
        if N == 1 and held < window:
            return None
        q = mx.arange(held, held + N)[:, None]
        k = mx.arange(held + N)[None]
        return (k <= q) & (k > q - window)

    def trimmable_by(self, n: int) -> bool:
        """Whether `n` positions can go and every later query still finds its window."""
        return n <= self.offset and self._size - n >= min(
            self.window - 1, self.offset - n
        )

    def trim(self, n: int) -> int:
        n = min(n, self.offset)
        if not self.trimmable_by(n):
            raise ValueError(
                f"A sliding-window cache holding {self._size} positions cannot take "
                f"back {n}: the layer would lose part of its {self.window}-token window"
            )
        self.offset -= n
        self._size -= n
        return n

    def is_trimmable(self) -> bool:
        return True

    def size(self) -> int:
        return self._size

    @property
    def state(self):
        if self.keys is None:
            return []
        return [self.keys[..., : self._size, :], self.values[..., : self._size, :]]

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.state)
