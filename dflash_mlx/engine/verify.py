"""Acceptance rules for a drafted block, computed entirely in MLX (one sync per block).

Each rule returns `(n_accepted, emitted)` as arrays: `emitted` has one slot per block
position; its first n_accepted + 1 entries are the tokens to commit (accepted drafts,
then the target's correction or bonus token). Greedy blocks (and seeded ones) use
`accept_greedy` whatever proposed the drafts; sampled blocks use `accept_sampled` for
the drafter's draws and `accept_lookup` for prompt lookup's copies (a deterministic
draft, q one-hot); a splice of both gives its copies `one_hot` q rows.
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


def _greedy_result(drafts: mx.array, target_logits: mx.array) -> mx.array:
    n_accepted, emitted = accept_greedy(drafts, target_logits)
    return mx.concatenate([n_accepted[None].astype(emitted.dtype), emitted])


# `accept_greedy` as [n_accepted, emitted...] in one array, compiled: one trace per
# block size, then a few fused ops instead of ~20 (integer ops and an argmax: exact)
greedy_result = mx.compile(_greedy_result)


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


def accept_lookup(drafts: mx.array, target_probs: mx.array):
    """Lossless sampling for deterministic drafts (prompt lookup: q is one-hot).

    drafts (..., n) were chosen without sampling; target_probs is (..., n+1, V). Accept
    d_i with probability p_i(d_i) (min(1, p/q) at q = 1); at the first rejection draw
    from p_i with d_i removed, renormalised (max(0, p - q)); if all are accepted draw a
    bonus token from p_n. Leading axes are a batch: each row is its own block.
    """
    n = drafts.shape[-1]
    p = mx.take_along_axis(target_probs[..., :n, :], drafts[..., None], axis=-1)
    u = mx.random.uniform(shape=drafts.shape)
    n_accepted = mx.sum(mx.cumprod((u < p[..., 0]).astype(mx.int32), axis=-1), axis=-1)
    row = mx.take_along_axis(target_probs, n_accepted[..., None, None], axis=-2)[
        ..., 0, :
    ]
    # the rejected draft (none past the last: the bonus row keeps all of p)
    padded = mx.concatenate([drafts, mx.full(drafts.shape[:-1] + (1,), -1)], axis=-1)
    rejected = mx.take_along_axis(padded, n_accepted[..., None], axis=-1)
    residual = mx.where(mx.arange(row.shape[-1]) == rejected, 0.0, row)
    mass = mx.sum(residual, axis=-1, keepdims=True)
    # mass can only vanish through rounding when p(d) == 1, which is never rejected
    residual = mx.where(mass > 1e-12, residual / mx.maximum(mass, 1e-30), row)
    bonus = categorical(residual)
    pos = mx.arange(n + 1)
    emitted = mx.where(
        pos < n_accepted[..., None],
        padded.astype(drafts.dtype),
        bonus[..., None].astype(drafts.dtype),
    )
    return n_accepted, emitted


def one_hot(drafts: mx.array, vocab: int) -> mx.array:
    """q rows (n, V) of deterministic drafts, for `accept_sampled` in a block that
    mixes them with sampled ones (a splice): there min(1, p/q) = p and max(0, p - q)
    is p without the draft, `accept_lookup`'s rule."""
    return (mx.arange(vocab)[None] == drafts[:, None]).astype(mx.float32)
