"""The DFlash block-diffusion drafter (v1), in the z-lab checkpoint format.

The drafter has no embedding or LM head of its own: the caller embeds the block with
the target's table and turns hidden states into logits with the target's head.
Context (fused target features) is absorbed into a per-layer KV cache once; a block
is then drafted in one forward whose own keys/values are dropped afterwards.
"""

from typing import cast

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.cache import KVCache

from ..kernels import MLX, ForwardTables, Kernels, WindowMask, shared_rope
from ..sampling import categorical, perturbed
from .cache import WindowedKVCache
from .draft_config import (
    ARCHITECTURES,
    LAYER_TYPES,
    ModelArgs,
    default_target_layer_ids,
)
from .draft_layers import (
    MLP,
    Attention,
    DecoderLayer,
    compiled_piece,
    inference_kernels,
)

__all__ = [
    "ARCHITECTURES",
    "LAYER_TYPES",
    "Model",
    "ModelArgs",
    "block_mask",
    "default_target_layer_ids",
]


def block_mask(block_len: int, context_len: int, window: int | None, causal: bool):
    """Mask of block queries over [context; block] keys: None when all keys are
    visible, "causal" when only the block is causal, else a `WindowMask` (query t at
    position context_len + t sees context keys less than `window` positions back)."""
    skip = None if window is None else context_len - window + 1
    if skip is None or skip + block_len - 1 <= 0:  # the window hides no key
        return "causal" if causal else None
    return WindowMask(skip, causal)


class Model(nn.Module):
    """DFlash v1 drafter: fc + hidden_norm fuse target features; Qwen3-style layers."""

    layer_class = DecoderLayer
    # greedy proposals are the argmax of each position's logits (a batch takes
    # them for all its rows at once)
    argmax_proposals = True

    def __init__(self, args: ModelArgs):
        super().__init__()
        self.args = args
        n_features = len(args.target_layer_ids) * args.hidden_size
        self.fc = nn.Linear(n_features, args.hidden_size, bias=False)
        self.hidden_norm = nn.RMSNorm(args.hidden_size, eps=args.rms_norm_eps)
        self.layers = [self.layer_class(args, t) for t in args.layer_types]
        self.norm = nn.RMSNorm(args.hidden_size, eps=args.rms_norm_eps)
        self.context_window: int | None = None  # bound on absorbed context, if any
        if args.draft_vocab_size:
            # Token ids the head scores (see draft_head.py); loaded with the weights,
            # never trained.
            self.draft_vocab = mx.arange(args.draft_vocab_size, dtype=mx.int32)
            self.freeze(recurse=False, keys=["draft_vocab"])

    kernels: Kernels = MLX

    def projections(self) -> list[nn.Linear]:
        """The linear layers inference runs through `kernels.linear`/`gated`."""
        layers = [self.fc]
        for layer in self.layers:
            attn, mlp = layer.self_attn, layer.mlp
            layers += [attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj]
            layers += [mlp.gate_proj, mlp.up_proj, mlp.down_proj]
        return layers

    def use_kernels(self, kernels: Kernels):
        """Run inference through `kernels` (see backend.for_device); training uses
        MLX's."""
        self.kernels = kernels
        rope = shared_rope(self.layers) if kernels.rope is not None else None
        tables = None if rope is None else ForwardTables(rope, kernels.rope_table)
        for module in self.modules():
            if isinstance(module, (MLP, Attention, DecoderLayer)):
                module.kernels = kernels
            if isinstance(module, Attention):
                module.tables = tables

    @property
    def dtype(self):
        """Activation dtype: that of the (never quantized) norm weights."""
        return self.norm.weight.dtype

    def make_cache(self, context_window: int | None = None) -> list:
        """Per-layer context caches; sliding layers keep only what their window sees.

        `context_window` bounds every layer's context (drafts only, output stays exact).
        """
        windows = self._windows(context_window or self.context_window)
        return [KVCache() if w is None else WindowedKVCache(w) for w in windows]

    def _windows(self, context_window: int | None) -> list[int | None]:
        """Each layer's window on the context (None: all of it)."""
        windows = []
        for layer in self.layers:
            window = context_window
            if layer.layer_type == "sliding_attention":
                own = (self.args.sliding_window or 1) - 1  # checked at load
                window = own if window is None else min(window, own)
            windows.append(window)
        return windows

    def reach(self) -> int | None:
        """How many of the latest context positions any layer reads (None: all): a
        prefill need not absorb the positions before them."""
        windows = self._windows(self.context_window)
        return None if None in windows else max(cast(list[int], windows))

    def skip(self, n: int, cache: list):
        """Advance the context caches past `n` positions no layer will read (RoPE
        positions stay absolute); only on caches of `make_cache` with a bounded
        `reach`."""
        for c in cache:
            c.skip(n)

    def absorb(self, features: mx.array, cache: list[KVCache], counts=None):
        """Feed fused target features of newly committed tokens into the context
        cache (a batch's caches: row b takes its first counts[b])."""
        ctx = compiled_piece(self, "_context", [self.fc, self.hidden_norm])(features)
        for layer, c in zip(self.layers, cache, strict=True):
            layer.self_attn.absorb(ctx, c)
            if counts is not None:
                c.commit(counts)

    def _context(self, features: mx.array) -> mx.array:
        kernels = inference_kernels(self)
        ctx = kernels.linear(self.fc, features.astype(self.dtype))
        return kernels.norm(self.hidden_norm, ctx)

    def _final_norm(self, h: mx.array) -> mx.array:
        return inference_kernels(self).norm(self.norm, h)

    def _mask(self, layer_type: str, block_len: int, cache):
        sliding = layer_type == "sliding_attention"
        causal = sliding if self.args.is_causal is None else bool(self.args.is_causal)
        window = self.args.sliding_window if sliding else None
        if hasattr(cache, "block_mask"):  # a batch's caches: rows of many lengths
            window = window or self.context_window
            return cache.block_mask(block_len, causal, window)
        return block_mask(block_len, cache.size(), window, causal)

    def __call__(self, block_embeddings: mx.array, cache: list[KVCache]) -> mx.array:
        """Hidden states (normed) for a block; the block's keys/values are not kept."""
        h = block_embeddings.astype(self.dtype)
        L = h.shape[1]
        masks = {}
        for layer, c in zip(self.layers, cache, strict=True):
            key = (layer.layer_type, c.size())
            if key not in masks:
                masks[key] = self._mask(layer.layer_type, L, c)
            h = layer(h, masks[key], c)
        for c in cache:
            c.trim(L)
        return compiled_piece(self, "_final_norm", self.norm)(h)

    def propose(self, hidden, logits, anchor, params, noise=None):
        """Block tokens from drafted-position logits (L, V): (tokens, q or None when
        greedy). With `noise` (a seeded generation's Gumbel noise for these positions)
        each token is argmax(log q + noise), coupled with the target's own draw.

        `hidden` and `anchor` (the token before the block) are unused by v1 drafters.
        """
        if params.greedy:
            return mx.argmax(logits, axis=-1), None
        q = params.probs(logits)
        if noise is not None:
            return mx.argmax(perturbed(q, noise), axis=-1), q
        return categorical(q), q

    def finalize_logits(self, logits: mx.array) -> mx.array:
        """Apply the drafter's output multiplier and soft-capping to head logits."""
        if self.args.output_multiplier != 1.0:
            logits = logits * self.args.output_multiplier
        cap = self.args.final_logit_softcapping
        if cap:
            logits = mx.tanh(logits / cap) * cap
        return logits

    def sanitize(self, weights: dict) -> dict:
        # Drafter checkpoints never carry their own embedding or head.
        return {
            k: v
            for k, v in weights.items()
            if not k.startswith(("embed_tokens.", "lm_head."))
        }
