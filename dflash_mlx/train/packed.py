"""The drafter's training forward: every block of a sequence in one pass.

It runs the submodules of `draft.Model` (fc, hidden_norm, layers, norm) in the same
order and with the same math as inference (`absorb` then `__call__`), so trained
weights drop into `draft.Model` unchanged; only the attention is packed: queries from
all blocks, keys/values [context ; all blocks], and a block-sparse mask.
"""

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from ..draft import Model as DraftModel
from ..draft_head import DraftHead
from .blocks import Blocks, packed_mask


def _heads(x: mx.array, proj, norm, n: int, rope, offset) -> mx.array:
    N, L, _ = x.shape
    y = proj(x).reshape(N, L, n, -1)
    if norm is not None:
        y = norm(y)
    y = y.transpose(0, 2, 1, 3)
    return rope(y, offset=offset) if rope is not None else y


def _pack(x: mx.array) -> mx.array:
    """(n, H, B, D) → (1, H, n·B, D): all blocks in one sequence, block-major."""
    n, H, B, D = x.shape
    return x.transpose(1, 0, 2, 3).reshape(1, H, n * B, D)


def _attention(attn, x: mx.array, ctx: mx.array, offsets: mx.array, mask: mx.array):
    n, B, _ = x.shape
    q = _heads(x, attn.q_proj, attn.q_norm, attn.n_heads, attn.rope, offsets)
    kb = _heads(x, attn.k_proj, attn.k_norm, attn.n_kv_heads, attn.rope, offsets)
    vb = _heads(x, attn.v_proj, None, attn.n_kv_heads, None, None)
    kc = _heads(ctx, attn.k_proj, attn.k_norm, attn.n_kv_heads, attn.rope, 0)
    vc = _heads(ctx, attn.v_proj, None, attn.n_kv_heads, None, None)
    keys = mx.concatenate([kc, _pack(kb)], axis=2)
    values = mx.concatenate([vc, _pack(vb)], axis=2)
    out = mx.fast.scaled_dot_product_attention(
        _pack(q), keys, values, scale=attn.scale, mask=mask
    )
    H, D = out.shape[1], out.shape[3]
    out = out.reshape(H, n, B, D).transpose(1, 2, 0, 3).reshape(n, B, H * D)
    return attn.o_proj(out)


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
    head = head or DraftHead.for_drafter(target, draft)
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
    head = head or DraftHead.for_drafter(target, draft)
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
