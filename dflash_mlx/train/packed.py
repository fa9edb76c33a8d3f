"""The drafter's training forward: every block of a sequence in one pass.

It runs the submodules of `draft.Model` (fc, hidden_norm, layers, norm) in the same
order and with the same math as inference (`absorb` then `__call__`), so trained
weights drop into `draft.Model` unchanged; only the attention is packed. Every block's
queries score the shared context keys in one product and their own block's keys in a
batched one, under one softmax: the cost grows with blocks × (context + block size),
not with blocks × (context + all blocks) as one masked attention over every key would.
"""

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from ..kernels import MLX
from ..models.draft import Model as DraftModel
from ..models.draft_head import DraftHead
from .blocks import Blocks, PackedMask, packed_mask


def _heads(x: mx.array, proj, norm, n: int, rope, offset) -> mx.array:
    N, L, _ = x.shape
    y = proj(x).reshape(N, L, n, -1)
    if norm is not None:
        y = norm(y)
    y = y.transpose(0, 2, 1, 3)
    return rope(y, offset=offset) if rope is not None else y


def _attention(attn, x: mx.array, ctx: mx.array, offsets: mx.array, mask: PackedMask):
    n, B, _ = x.shape
    H, Hkv = attn.n_heads, attn.n_kv_heads
    r = H // Hkv  # query heads per key/value head, as in grouped-query attention
    q = _heads(x, attn.q_proj, attn.q_norm, H, attn.rope, offsets) * attn.scale
    kb = _heads(x, attn.k_proj, attn.k_norm, Hkv, attn.rope, offsets)[:, :, None]
    vb = _heads(x, attn.v_proj, None, Hkv, None, None)[:, :, None]
    kc = _heads(ctx, attn.k_proj, attn.k_norm, Hkv, attn.rope, 0)[0][:, None]
    vc = _heads(ctx, attn.v_proj, None, Hkv, None, None)[0][:, None]
    D, C = q.shape[-1], kc.shape[2]
    q = q.reshape(n, Hkv, r, B, D)

    def to_rows(t):  # (n, Hkv, r, B, ·) -> (Hkv, r, n·B, ·): all queries in a row
        return t.transpose(1, 2, 0, 3, 4).reshape(Hkv, r, n * B, -1)

    def to_blocks(t):  # the inverse
        return t.reshape(Hkv, r, n, B, -1).transpose(2, 0, 1, 3, 4)

    never = mx.array(-mx.inf, dtype=q.dtype)
    on_ctx = mx.where(mask.context, to_rows(q) @ kc.swapaxes(-1, -2), never)
    on_own = q @ kb.swapaxes(-1, -2)
    if mask.block is not None:
        on_own = mx.where(mask.block, on_own, never)
    p = mx.softmax(mx.concatenate([on_ctx, to_rows(on_own)], -1), -1, precise=True)
    out = to_blocks(p[..., :C] @ vc) + to_blocks(p[..., C:]) @ vb
    return attn.o_proj(out.transpose(0, 3, 1, 2, 4).reshape(n, B, H * D))


def layer_masks(
    draft: DraftModel, anchors: np.ndarray, block_size: int, context_len: int
) -> dict:
    """A packed mask per layer type, following the drafter's causal/sliding settings."""
    masks = {}
    for layer in draft.layers:
        t = layer.layer_type
        if t in masks:
            continue
        sliding = t == "sliding_attention"
        causal = sliding if draft.args.is_causal is None else bool(draft.args.is_causal)
        window = draft.args.sliding_window if sliding else None
        masks[t] = packed_mask(anchors, block_size, context_len, causal, window)
    return masks


def packed_hidden(
    draft: DraftModel,
    features: mx.array,
    block_embeddings: mx.array,
    anchors: np.ndarray,
    masks: dict | None = None,
) -> mx.array:
    """Normed hidden states (n, B, hidden) of all blocks of one sequence.

    `features` (1, C, F) are the fused target features of positions 0..C−1 with
    C ≥ max(anchors); `block_embeddings` (n, B, hidden) the embedded block inputs.
    """
    n, B, _ = block_embeddings.shape
    C = features.shape[1]
    if masks is None:
        masks = layer_masks(draft, anchors, B, C)
    ctx = draft.hidden_norm(draft.fc(features))
    offsets = mx.array(np.asarray(anchors, dtype=np.int32))
    h = block_embeddings
    for layer in draft.layers:
        h = h + _attention(
            layer.self_attn,
            layer.input_layernorm(h),
            ctx,
            offsets,
            masks[layer.layer_type],
        )
        h = h + layer.mlp(layer.post_attention_layernorm(h))
    return draft.norm(h)


def embed_blocks(target, draft: DraftModel, inputs: np.ndarray) -> mx.array:
    """Block inputs embedded with the (frozen) target table, as at inference."""
    h = target.embed(mx.array(inputs))
    if draft.args.input_embedding_scale != 1.0:
        h = h * draft.args.input_embedding_scale
    return mx.stop_gradient(h)


def block_logits(
    target,
    draft: DraftModel,
    features: mx.array,
    blocks: Blocks,
    masks: dict | None = None,
    head: DraftHead | None = None,
) -> mx.array:
    """Draft logits (n, B−1, draft vocab) for block positions 1..B−1."""
    head = head or DraftHead.for_drafter(target, draft, MLX)
    emb = embed_blocks(target, draft, blocks.inputs)
    h = packed_hidden(draft, features, emb, blocks.anchors, masks)
    return draft.finalize_logits(head(h[:, 1:]))


def block_loss(
    target,
    draft: DraftModel,
    features: mx.array,
    blocks: Blocks,
    masks: dict | None = None,
    head: DraftHead | None = None,
):
    """(weighted cross-entropy normalised by the weight sum, weight sum, correct·weight
    sum).

    Only the drafter's parameters receive gradients: the target's embedding and head
    enter as constants of the graph. With a draft vocabulary, labels outside it carry no
    loss (the drafter can never propose them).
    """
    head = head or DraftHead.for_drafter(target, draft, MLX)
    logits = block_logits(target, draft, features, blocks, masks, head).astype(
        mx.float32
    )
    labels, w = blocks.labels[:, 1:], blocks.weights[:, 1:]
    if head.index is not None:
        labels = head.index[labels]
        w = np.where(labels >= 0, w, 0.0).astype(np.float32)
        labels = np.maximum(labels, 0)
    targets, weights = mx.array(labels), mx.array(w)
    ce = nn.losses.cross_entropy(logits, targets)
    wsum = weights.sum()
    loss = (ce * weights).sum() / mx.maximum(wsum, 1e-9)
    hits = mx.argmax(logits, axis=-1) == targets
    correct = mx.stop_gradient((hits * weights).sum())
    return loss, wsum, correct
