"""Acceptance rules for a drafted block, computed entirely in MLX (one sync per block).

Both rules return `(n_accepted, emitted)` as arrays: `emitted` has one slot per block
position; its first n_accepted + 1 entries are the tokens to commit (accepted drafts,
then the target's correction or bonus token).
"""

import mlx.core as mx

from ..sampling import categorical


def _emit(drafts: mx.array, n_accepted: mx.array, last: mx.array) -> mx.array:
    """[d_1..d_a, last, pad…] laid out over the block's positions."""
    pos = mx.arange(drafts.shape[-1] + 1)
    padded = mx.concatenate([drafts, mx.zeros((1,), drafts.dtype)])
    return mx.where(pos < n_accepted, padded, last.astype(drafts.dtype))


def accept_greedy(drafts: mx.array, target_logits: mx.array):
    """Longest prefix of `drafts` (n,) equal to the argmax of target logits (n+1, V)."""
    choice = mx.argmax(target_logits, axis=-1)
    n = drafts.shape[0]
    matches = (drafts == choice[:n]).astype(mx.int32)
    n_accepted = mx.sum(mx.cumprod(matches))
    return n_accepted, _emit(drafts, n_accepted, choice[n_accepted])


def accept_sampled(
    drafts: mx.array,
    draft_probs: mx.array,
    target_probs: mx.array,
):
    """Lossless speculative sampling (Leviathan et al.) for a parallel-drafted block.

    drafts (n,) were sampled from draft_probs (n, V); target_probs is (n+1, V). Accept
    d_i with probability min(1, p_i(d_i)/q_i(d_i)); at the first rejection draw from
    normalize(max(0, p_i - q_i)); if all are accepted draw a bonus token from p_n.
    """
    n = drafts.shape[0]
    p = mx.take_along_axis(target_probs[:n], drafts[:, None], axis=-1)[:, 0]
    q = mx.take_along_axis(draft_probs, drafts[:, None], axis=-1)[:, 0]
    u = mx.random.uniform(shape=(n,))
    n_accepted = mx.sum(mx.cumprod((u * q < p).astype(mx.int32)))
    q_padded = mx.concatenate([draft_probs, mx.zeros_like(target_probs[:1])], axis=0)
    p_row, q_row = target_probs[n_accepted], q_padded[n_accepted]
    residual = mx.maximum(p_row - q_row, 0)
    mass = mx.sum(residual)
    # mass can only vanish through rounding when p == q; then p itself is the answer
    residual = mx.where(mass > 1e-12, residual / mx.maximum(mass, 1e-30), p_row)
    return n_accepted, _emit(drafts, n_accepted, categorical(residual))
