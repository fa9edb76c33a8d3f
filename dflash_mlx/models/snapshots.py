"""What each layer of a PromptCache keeps, as the prefix cache sees it: a KV history
(cut at any position), a drafter's window (its state as a snapshot, cut back a little)
or another state (a recurrent layer's arrays: a snapshot, restored whole); and the
snapshots themselves, taken and restored."""

from dataclasses import dataclass

import mlx.core as mx
from mlx_lm.models.cache import ArraysCache, KVCache, QuantizedKVCache

from .cache import PromptCache, WindowedKVCache

KV, STATE, WINDOW = "kv", "state", "window"
HISTORIES = (KVCache, QuantizedKVCache)  # caches that can be cut at any position
# The most positions a restored window is cut back by: each one is a position the
# drafter no longer sees until it slides past (its proposals, never the output).
WINDOW_CUT = 256


@dataclass(frozen=True)
class Arrays:
    """A recurrent layer's state (an ArraysCache's arrays)."""

    arrays: tuple


@dataclass(frozen=True)
class Window:
    """A drafter window's kept keys and values, and the position after them."""

    keys: mx.array | None
    values: mx.array | None
    offset: int


Snapshot = list  # per layer: Arrays, Window, or None for KV layers


def layers(cache: PromptCache) -> list:
    """A PromptCache's layer caches: the target's, then the drafter's."""
    return list(cache.target) + list(cache.draft or [])


def layer_kinds(cache: PromptCache) -> list[str | None]:
    """Per layer: KV (a history that can be cut anywhere), WINDOW (a drafter's window:
    snapshots, cut back a little), STATE (snapshots only) or None (no cache)."""
    kinds: list[str | None] = []
    for c in layers(cache):
        if c is None:
            kinds.append(None)
        elif type(c) in HISTORIES:
            kinds.append(KV)
        else:
            kinds.append(WINDOW if isinstance(c, WindowedKVCache) else STATE)
    return kinds


def take_snapshot(cache: PromptCache) -> Snapshot:
    """The states of `cache`'s non-KV layers as they are now. Their arrays are never
    written in place by their caches, so holding them is a copy."""
    out: Snapshot = []
    for c in layers(cache):
        if c is None or type(c) in HISTORIES:
            out.append(None)
        elif isinstance(c, ArraysCache):
            out.append(Arrays(tuple(c.cache)))
        else:  # a drafter's window
            keys, values = c.kept()
            out.append(Window(keys, values, c.offset))
    return out


def snapshot_bytes(snapshot: Snapshot | None) -> int:
    total = 0
    for s in snapshot or []:
        arrays = s.arrays if isinstance(s, Arrays) else (s.keys, s.values) if s else ()
        total += sum(a.nbytes for a in arrays if a is not None)
    return total


def restore_state(cache, state) -> None:
    """Give a fresh non-KV layer cache a snapshot's state."""
    if isinstance(state, Arrays):
        cache.cache = list(state.arrays)
    elif isinstance(state, Window):
        cache.restore(state.keys, state.values, state.offset)
