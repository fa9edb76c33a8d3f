"""Prompts served before, kept for the next request that starts the same way.

A radix tree over token ids. Each node holds a span of tokens and, for every layer
whose cache is a KV history (attention; a quantized one holds (packed, scales,
biases) for the keys and for the values), the keys and values of that span, so a
prefix several conversations share (an agent's system prompt and tools) is stored
once. Layers whose cache cannot be cut at any position (GatedDeltaNet states, a
drafter's sliding window) are kept as snapshots of their state at chosen node ends: the
end of a prompt, the end of its system part, the end of a generation, and a bounded
ladder of points inside long prompts (the caller takes them; see serve/engine.py). A
request gets the longest prefix the tree can rebuild exactly: any matched length when
every layer is a KV history, else the deepest matched node end with a snapshot. A
drafter's window can be cut back too (what it loses only thins its proposals): where
windows are the only snapshots, a snapshot a little past the matched length serves it
(the same prompt again: all but its last token).

Least recently used leaves go first when the bytes pass the budget; a `spill`
(prefix_disk.DiskSpill) gets them on the way out, and serves the prefixes RAM has lost.
Only the engine thread calls it.
"""

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import mlx.core as mx
from mlx.utils import tree_flatten
from mlx_lm.models.cache import KVCache

from .cache import PromptCache
from .snapshots import (
    KV,
    STATE,
    WINDOW,
    WINDOW_CUT,
    Snapshot,
    layer_kinds,
    layers,
    restore_state,
    snapshot_bytes,
    take_snapshot,
)


def each(x, f):
    """`f` over an array, or over each array of a quantized (packed, scales, biases)."""
    return tuple(f(a) for a in x) if isinstance(x, tuple) else f(x)


def nbytes(spans) -> int:
    flat = dict(tree_flatten([s for s in spans if s]))
    return sum(a.nbytes for a in flat.values() if isinstance(a, mx.array))


@dataclass(eq=False)
class Node:
    tokens: tuple[int, ...] = ()
    parent: "Node | None" = None
    children: dict = field(default_factory=dict)  # first token -> child
    spans: list = field(default_factory=list)  # per layer: (keys, values) or None
    snapshot: Snapshot | None = None  # the non-KV layers' states at this node's end
    used: float = 0.0
    nbytes: int = 0

    def end(self) -> int:
        """Tokens from the root to this node's end."""
        n, node = 0, self
        while node.parent is not None:
            n, node = n + len(node.tokens), node.parent
        return n

    def path(self) -> list["Node"]:
        """The nodes from the root's child down to this one."""
        nodes, node = [], self
        while node.parent is not None:
            nodes.append(node)
            node = node.parent
        return nodes[::-1]


@dataclass
class Stats:
    hits: int = 0
    misses: int = 0
    reused_tokens: int = 0
    evicted: int = 0


class PrefixStore:
    """Shared prefixes of the prompts served, at most `max_bytes` of them in RAM."""

    def __init__(
        self, make_cache: Callable[[], PromptCache], max_bytes: int, spill=None
    ):
        if max_bytes < 0:
            raise ValueError(
                f"prompt cache bytes must be >= 0 (0 turns reuse off), got {max_bytes}."
            )
        self.make_cache, self.max_bytes, self.spill = make_cache, max_bytes, spill
        self.root = Node()
        self.kinds = layer_kinds(make_cache())
        # every layer a KV history: a prefix of any length can be rebuilt
        self.cut_anywhere = STATE not in self.kinds and WINDOW not in self.kinds
        # the snapshots are windows only: one a little past a length serves it
        self.cut_back = not self.cut_anywhere and STATE not in self.kinds
        self.stats = Stats()
        self.nbytes = 0

    def __len__(self) -> int:
        return sum(1 for _ in self._nodes()) - 1

    # -- serving a prompt -----------------------------------------------------------
    def restore(self, tokens: Sequence[int], limit: int | None = None):
        """(a new PromptCache holding the longest prefix of `tokens` this store can
        rebuild, at most `limit` tokens and never all of them, its length)."""
        most = len(tokens) - 1 if limit is None else min(limit, len(tokens) - 1)
        node, length = self._find(tokens, most)
        if self.spill is not None:
            disk = self.spill.find(tokens, most, self.cut_anywhere)
            if disk > length:
                cache = self.spill.load(tokens, disk, self.make_cache)
                if cache is not None:
                    self._count(disk)
                    self.insert(cache.tokens, cache, {})
                    return cache, disk
        cache = self.make_cache()
        if node is None:
            self.stats.misses += 1
            return cache, 0
        path, now = node.path(), time.monotonic()
        for n in path:
            n.used = now
        self._rebuild(cache, path, length, room=len(tokens) - length)
        cache.tokens = list(tokens[:length])
        self._count(length)
        return cache, length

    def _find(self, tokens: Sequence[int], most: int) -> tuple[Node | None, int]:
        """The node whose path covers the prefix to serve, and its length."""
        node, matched, inner = self._match(tokens)
        if self.cut_anywhere:
            length = min(matched, most)
            while node.parent is not None and node.end() - len(node.tokens) >= length:
                node = node.parent
        elif self.cut_back and (past := _snapshot_past(node, min(matched, most))):
            return past, min(matched, most)
        else:  # the deepest node end, reached whole, with a snapshot
            if inner < len(node.tokens) and node.parent is not None:
                node = node.parent
            while node.parent is not None and (
                node.snapshot is None or node.end() > most
            ):
                node = node.parent
            length = node.end()
        return (None, 0) if node.parent is None or length == 0 else (node, length)

    def _match(self, tokens: Sequence[int]) -> tuple[Node, int, int]:
        """(deepest node reached, tokens matched, tokens of that node matched)."""
        node, matched, inner = self.root, 0, 0
        while matched < len(tokens):
            child = node.children.get(tokens[matched])
            if child is None:
                break
            n = _common(child.tokens, tokens[matched:])
            node, matched, inner = child, matched + n, n
            if n < len(child.tokens):
                break
        return node, matched, inner

    def _rebuild(self, cache: PromptCache, path: list[Node], length: int, room: int):
        """`path`'s first `length` positions into `cache`; its last node's snapshot
        for the other layers, a window cut back to `length`."""
        for i, (c, kind) in enumerate(zip(layers(cache), self.kinds, strict=True)):
            if kind == KV:
                c.keys = _laid_out([n.spans[i][0] for n in path], length, room)
                c.values = _laid_out([n.spans[i][1] for n in path], length, room)
                c.offset = length
            elif kind in (STATE, WINDOW):
                restore_state(c, (path[-1].snapshot or [])[i])
                if kind == WINDOW and c.offset > length:
                    c.trim(c.offset - length)

    def _count(self, length: int):
        self.stats.hits += 1
        self.stats.reused_tokens += length

    # -- keeping a finished sequence ------------------------------------------------
    def insert(self, tokens: Sequence[int], cache: PromptCache, snapshots: dict):
        """Keep what `cache` holds for `tokens`, with the states `snapshots` maps
        positions to (and `cache`'s own at its end); the paths of the leaves evicted
        to make room, as token tuples."""
        if self.max_bytes == 0 or not cache.tokens:
            return []
        kept = tuple(tokens[: len(cache.tokens)])
        node, matched, inner = self._match(kept)
        if inner < len(node.tokens):
            node = self._split(node, inner)
        if matched < len(kept):
            node = self._grow(node, kept, matched, cache)
        now = time.monotonic()
        for n in node.path():
            n.used = now
        if not self.cut_anywhere:
            points = {p: s for p, s in snapshots.items() if 0 < p < len(kept)}
            points[len(kept)] = take_snapshot(cache)
            for position in sorted(points):
                self._place(kept[:position], points[position])
        return self._evict()

    def _grow(self, parent: Node, tokens: tuple, start: int, cache: PromptCache):
        spans: list = []
        for c, kind in zip(layers(cache), self.kinds, strict=True):
            if kind != KV:
                spans.append(None)
                continue
            span = [each(a, lambda x: x[..., start:, :]) for a in c.keys_and_values()]
            spans.append(tuple(each(a, mx.contiguous) for a in span))  # not a view
        mx.eval([s for s in spans if s])
        child = Node(tokens[start:], parent, {}, spans, used=time.monotonic())
        child.nbytes = nbytes(spans)
        parent.children[child.tokens[0]] = child
        self.nbytes += child.nbytes
        return child

    def _split(self, node: Node, at: int) -> Node:
        """Cut `node`'s span after `at` tokens; the new upper node is returned."""
        assert node.parent is not None
        upper = Node(node.tokens[:at], node.parent, {}, [], None, node.used)
        lower: list = []
        for span in node.spans:
            if span is None:
                upper.spans.append(None)
                lower.append(None)
                continue
            upper.spans.append(
                tuple(each(a, lambda x: mx.contiguous(x[..., :at, :])) for a in span)
            )
            lower.append(
                tuple(each(a, lambda x: mx.contiguous(x[..., at:, :])) for a in span)
            )
        mx.eval([s for s in upper.spans + lower if s])
        node.spans = lower
        node.parent.children[node.tokens[0]] = upper
        node.tokens, node.parent = node.tokens[at:], upper
        upper.children[node.tokens[0]] = node
        kv = nbytes(upper.spans)
        upper.nbytes, node.nbytes = kv, node.nbytes - kv
        return upper

    def _place(self, prefix: tuple, snapshot: Snapshot):
        node, matched, inner = self._match(prefix)
        if matched != len(prefix) or node.parent is None:
            return
        if inner < len(node.tokens):
            node = self._split(node, inner)
        if node.snapshot is None:
            node.snapshot = snapshot
            size = snapshot_bytes(snapshot)
            node.nbytes += size
            self.nbytes += size

    # -- eviction -------------------------------------------------------------------
    def _nodes(self):
        stack = [self.root]
        while stack:
            node = stack.pop()
            yield node
            stack.extend(node.children.values())

    def _evict(self) -> list[tuple]:
        evicted = []
        while self.nbytes > self.max_bytes:
            leaves = [n for n in self._nodes() if n.parent and not n.children]
            if not leaves:
                break
            # a leaf no request can be served from goes first, then the oldest
            leaf = min(leaves, key=lambda n: (self._servable(n), n.used))
            if self.spill is not None and self._servable(leaf):
                self.spill.keep(self, leaf)
            evicted.append(tuple(t for n in leaf.path() for t in n.tokens))
            self._drop(leaf)
        return evicted

    def spill_all(self):
        """Every servable leaf to the spill (a server shutting down)."""
        if self.spill is None:
            return
        for node in list(self._nodes()):
            if node.parent is not None and not node.children and self._servable(node):
                self.spill.keep(self, node)

    def _servable(self, node: Node) -> bool:
        return self.cut_anywhere or node.snapshot is not None

    def _drop(self, leaf: Node):
        assert leaf.parent is not None
        del leaf.parent.children[leaf.tokens[0]]
        self.nbytes -= leaf.nbytes
        self.stats.evicted += 1

    def forget(self, path: tuple):
        """Drop the leaf `path` ends at (another rank's eviction, mirrored)."""
        node, matched, inner = self._match(path)
        if matched == len(path) and inner == len(node.tokens) and not node.children:
            if node.parent is not None:
                self._drop(node)


def _snapshot_past(node: Node, length: int) -> Node | None:
    """The node nearest past `length` on `node`'s path (itself or above) whose
    snapshot, cut back by at most WINDOW_CUT positions, holds `length`."""
    best, end = None, node.end()
    while length > 0 and node.parent is not None and end >= length:
        if node.snapshot is not None and end - length <= WINDOW_CUT:
            best = node
        end, node = end - len(node.tokens), node.parent
    return best


def _laid_out(spans: list, length: int, room: int) -> mx.array | tuple:
    """A KV layer's first `length` positions from its spans, in one buffer with space
    for `room` more and at least a KVCache step beyond (rounded up to the step): the
    rest of the prompt and the answer's first blocks are written there instead of
    the cache copying the whole history to grow. A quantized layer's spans are
    (packed, scales, biases): each laid out alike."""
    if isinstance(spans[0], tuple):
        return tuple(_laid_out(list(p), length, room) for p in zip(*spans, strict=True))
    parts, start = [], 0
    for span in spans:
        if start >= length:
            break
        parts.append(span[..., : length - start, :])
        start += span.shape[2]
    step = KVCache.step
    free = -(-(length + room + step) // step) * step - length
    if free:
        b, h, _, d = parts[0].shape
        parts.append(mx.zeros((b, h, free, d), parts[0].dtype))
    return parts[0] if len(parts) == 1 else mx.concatenate(parts, axis=2)


def _common(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n
