"""Training blocks: random anchors in a response, block inputs/labels/weights, and the
masks that pack all blocks of a sequence into one attention call.

Block i starts at anchor a_i: inputs [token a_i, MASK × (B−1)] at positions
a_i..a_i+B−1, labels tokens a_i+1..a_i+B−1. It sees target features of positions < a_i
(its context) and its own block, never another block: exactly what the drafter sees at
inference.
"""

from dataclasses import dataclass
from typing import NamedTuple

import mlx.core as mx
import numpy as np

GAMMAS = {16: 7.0, 10: 5.0, 8: 4.0}


def default_gamma(block_size: int) -> float:
    """Loss decay γ of the paper (7 for B=16, 5 for B=10, 4 for B=8), else ~0.45·B."""
    return GAMMAS.get(block_size, max(1.0, round(0.45 * block_size, 1)))


def position_weights(block_size: int, gamma: float | None = None) -> np.ndarray:
    """Weights of block positions 0..B−1: 0 for the anchor, exp(−(k−1)/γ) for k ≥ 1."""
    gamma = default_gamma(block_size) if gamma is None else gamma
    k = np.arange(block_size, dtype=np.float32)
    w = np.exp(-(k - 1) / gamma).astype(np.float32)
    w[0] = 0.0
    return w


def sample_anchors(
    rng: np.random.Generator, prompt_len: int, seq_len: int, n: int
) -> np.ndarray:
    """Up to `n` distinct sorted anchors in the response: prompt_len ≤ a ≤ seq_len − 2.

    The first block at inference starts at the first response token (position
    prompt_len), and an anchor needs at least one token after it to predict.
    """
    lo, hi = max(prompt_len, 1), seq_len - 1
    if hi <= lo:
        return np.zeros((0,), dtype=np.int64)
    count = min(n, hi - lo)
    return np.sort(rng.choice(np.arange(lo, hi), size=count, replace=False))


@dataclass
class Blocks:
    """All blocks of one sequence, flattened: arrays of shape (n_blocks, B)."""

    anchors: np.ndarray  # (n,)
    inputs: np.ndarray  # token ids: anchor token then mask ids
    labels: np.ndarray  # the token each position should predict (0 where none)
    weights: np.ndarray  # loss weight per position (0 for the anchor and past the end)


def make_blocks(
    tokens,
    anchors: np.ndarray,
    block_size: int,
    mask_id: int,
    gamma: float | None = None,
) -> Blocks:
    tokens = np.asarray(tokens, dtype=np.int64)
    pos = anchors[:, None] + np.arange(block_size)[None]  # (n, B)
    inside = pos < len(tokens)
    labels = np.where(inside, tokens[np.minimum(pos, len(tokens) - 1)], 0)
    weights = np.where(inside, position_weights(block_size, gamma)[None], 0.0).astype(
        np.float32
    )
    inputs = np.full(pos.shape, mask_id, dtype=np.int64)
    inputs[:, 0] = tokens[anchors]
    return Blocks(anchors, inputs, labels, weights)


class PackedMask(NamedTuple):
    """What the packed blocks' queries may see: `context` (n·B, C) over the shared
    context keys, `block` (B, B) inside each query's own block (None: all of it)."""

    context: mx.array
    block: mx.array | None


def packed_mask(
    anchors,
    block_size: int,
    context_len: int,
    causal: bool = False,
    window: int | None = None,
) -> PackedMask:
    """Block i sees context positions < a_i (within `window` of the query for sliding
    layers) and its own block (only earlier-or-equal positions when `causal`); never
    another block, so the block keys need no mask across blocks at all."""
    a = np.asarray(anchors, dtype=np.int64)
    B = block_size
    q_pos = (a[:, None] + np.arange(B)[None]).reshape(-1)  # absolute query positions
    k_ctx = np.arange(context_len)[None]
    ctx = k_ctx < np.repeat(a, B)[:, None]
    if window is not None:
        ctx &= (q_pos[:, None] - k_ctx) < window
    own = mx.array(np.tril(np.ones((B, B), dtype=bool))) if causal else None
    return PackedMask(mx.array(ctx), own)
