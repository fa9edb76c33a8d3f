"""The DFlash block-diffusion drafter (v1), in the z-lab checkpoint format.

The drafter has no embedding or LM head of its own: the caller embeds the block with
the target's table and turns hidden states into logits with the target's head.
Context (fused target features) is absorbed into a per-layer KV cache once; a block
is then drafted in one forward whose own keys/values are dropped afterwards.
"""

from dataclasses import dataclass, field, fields
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.cache import KVCache
from mlx_lm.models.rope_utils import initialize_rope

from ..kernels import MLX, ForwardTables, Kernels, WindowMask, shared_rope
from ..sampling import categorical, perturbed
from .cache import WindowedKVCache

ARCHITECTURES = ("DFlashDraftModel", "DFlash2DraftModel")
LAYER_TYPES = ("full_attention", "sliding_attention")


def default_target_layer_ids(
    num_target_layers: int, num_draft_layers: int
) -> list[int]:
    """Layer ids used when a config names none (the DFlash convention)."""
    if num_draft_layers == 1:
        return [num_target_layers // 2]
    span = num_target_layers - 4
    return [
        round(1 + k * span / (num_draft_layers - 1)) for k in range(num_draft_layers)
    ]


@dataclass
class ModelArgs:
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    intermediate_size: int
    vocab_size: int
    num_target_layers: int
    target_layer_ids: list[int]
    mask_token_id: int
    head_dim: int | None = None
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1_000_000.0
    rope_scaling: dict[str, Any] | None = None
    max_position_embeddings: int = 40960
    block_size: int = 16
    layer_types: list[str] = field(default_factory=list)
    sliding_window: int | None = None
    is_causal: bool | None = None
    final_logit_softcapping: float | None = None
    input_embedding_scale: float = 1.0
    output_multiplier: float = 1.0
    architecture: str = "DFlashDraftModel"
    conv_kernel_size: int = 0
    conv_group_size: int = 0
    selector_rank: int = 0
    selector_top_k: int = 0
    draft_vocab_size: int = 0  # 0: propose from the whole target vocabulary

    def __post_init__(self):
        if self.head_dim is None:
            self.head_dim = self.hidden_size // self.num_attention_heads
        if not self.layer_types:
            self.layer_types = ["full_attention"] * self.num_hidden_layers
        self.target_layer_ids = [int(i) for i in self.target_layer_ids]

    @classmethod
    def from_config(cls, config: dict) -> "ModelArgs":
        """Read a z-lab drafter config.json (fields may sit at top level or in
        dflash_config)."""
        flat = dict(config)
        flat.update(config.get("dflash_config") or {})
        rope = config.get("rope_parameters") or config.get("rope_scaling")
        if rope:
            flat.setdefault("rope_theta", rope.get("rope_theta", cls.rope_theta))
            if rope.get("rope_type", rope.get("type", "default")) == "default":
                rope = None
        flat["rope_scaling"] = rope
        archs = config.get("architectures") or ["DFlashDraftModel"]
        flat["architecture"] = archs[0]
        if not flat.get("target_layer_ids") and "num_target_layers" in flat:
            flat["target_layer_ids"] = default_target_layer_ids(
                flat["num_target_layers"], flat["num_hidden_layers"]
            )
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in flat.items() if k in names})

    def to_config(self) -> dict:
        """The z-lab config.json form of these arguments."""
        keys = (
            "target_layer_ids",
            "mask_token_id",
            "final_logit_softcapping",
            "input_embedding_scale",
            "output_multiplier",
            "conv_kernel_size",
            "conv_group_size",
            "selector_rank",
            "selector_top_k",
            "draft_vocab_size",
        )
        dflash = {
            k: getattr(self, k) for k in keys if getattr(self, k) not in (None, 0)
        }
        dflash["block_size"] = self.block_size
        top = {
            f.name: getattr(self, f.name)
            for f in fields(self)
            if f.name not in keys and f.name != "architecture"
        }
        top = {k: v for k, v in top.items() if v is not None}
        return {
            "architectures": [self.architecture],
            "model_type": "dflash",
            **top,
            "dflash_config": dflash,
        }


def _inference(module: nn.Module) -> Kernels:
    """The module's kernels; MLX's own while training (fused kernels have no
    gradients)."""
    return MLX if module.training else module.kernels


class MLP(nn.Module):
    kernels: Kernels = MLX  # Model.use_kernels picks the device's once

    def __init__(self, dim: int, hidden_dim: int):
        super().__init__()
        self.gate_proj = nn.Linear(dim, hidden_dim, bias=False)
        self.up_proj = nn.Linear(dim, hidden_dim, bias=False)
        self.down_proj = nn.Linear(hidden_dim, dim, bias=False)

    def __call__(self, x):
        kernels = _inference(self)
        return kernels.linear(
            self.down_proj, kernels.gated(self.gate_proj, self.up_proj, x)
        )


class Attention(nn.Module):
    """KV-injection attention: block queries see the context cache and the block."""

    kernels: Kernels = MLX

    def __init__(self, args: ModelArgs):
        super().__init__()
        dim = args.hidden_size
        hd = args.head_dim or dim // args.num_attention_heads
        self.n_heads = args.num_attention_heads
        self.n_kv_heads = args.num_key_value_heads
        self.scale = hd**-0.5
        self.q_proj = nn.Linear(dim, self.n_heads * hd, bias=False)
        self.k_proj = nn.Linear(dim, self.n_kv_heads * hd, bias=False)
        self.v_proj = nn.Linear(dim, self.n_kv_heads * hd, bias=False)
        self.o_proj = nn.Linear(self.n_heads * hd, dim, bias=False)
        self.q_norm = nn.RMSNorm(hd, eps=args.rms_norm_eps)
        self.k_norm = nn.RMSNorm(hd, eps=args.rms_norm_eps)
        self.rope = initialize_rope(
            hd, args.rope_theta, False, args.rope_scaling, args.max_position_embeddings
        )

    # the model's rotary tables, one per forward for all layers (Model.use_kernels)
    tables: ForwardTables | None = None

    def _rotate(self, x, offset):
        """(B, L, H, D) queries or keys at positions offset.. as (B, H, L, D) heads
        (`offset`: a tuple of one per row for a batch's caches)."""
        kernels = _inference(self)
        if kernels.rope is not None and self.tables is not None:
            return kernels.rope(x, self.tables.get(offset, x.shape[1]))
        if isinstance(offset, tuple):
            offset = mx.array(offset)
        return self.rope(x.transpose(0, 2, 1, 3), offset=offset)

    def _keys_values(self, x, offset):
        B, L, _ = x.shape
        kernels = _inference(self)
        k = kernels.linear(self.k_proj, x).reshape(B, L, self.n_kv_heads, -1)
        k = kernels.norm(self.k_norm, k)
        v = kernels.linear(self.v_proj, x).reshape(B, L, self.n_kv_heads, -1)
        return self._rotate(k, offset), v.transpose(0, 2, 1, 3)

    def absorb(self, ctx: mx.array, cache: KVCache):
        """Append the context's keys/values (at their absolute positions) to the
        cache."""
        keys_values = _compiled(self, "_keys_values", self)
        cache.update_and_fetch(*keys_values(ctx, _offset(self, cache)))
        if isinstance(cache, WindowedKVCache):
            cache.evict()

    def project(self, x, offset):
        """Rotated queries, keys and values (B, H, L, D) of x at positions offset.."""
        B, L, _ = x.shape
        kernels = _inference(self)
        q = kernels.linear(self.q_proj, x).reshape(B, L, self.n_heads, -1)
        q = self._rotate(kernels.norm(self.q_norm, q), offset)
        return (q, *self._keys_values(x, offset))

    def attend(self, q, k, v, mask, cache) -> mx.array:
        """Attention of the block's queries over the cache and the block (B, L, H*D),
        before the output projection."""
        keys, values = cache.update_and_fetch(k, v)
        out = _inference(self).attention(q, keys, values, self.scale, mask)
        return out.transpose(0, 2, 1, 3).reshape(q.shape[0], q.shape[2], -1)

    def __call__(self, x, mask, cache: KVCache):
        q, k, v = _compiled(self, "project", self)(x, _offset(self, cache))
        return _inference(self).linear(self.o_proj, self.attend(q, k, v, mask, cache))


class DecoderLayer(nn.Module):
    def __init__(self, args: ModelArgs, layer_type: str):
        super().__init__()
        self.layer_type = layer_type
        self.self_attn = Attention(args)
        self.mlp = MLP(args.hidden_size, args.intermediate_size)
        self.input_layernorm = nn.RMSNorm(args.hidden_size, eps=args.rms_norm_eps)
        self.post_attention_layernorm = nn.RMSNorm(
            args.hidden_size, eps=args.rms_norm_eps
        )

    kernels: Kernels = MLX

    def __call__(self, x, mask, cache):
        attn = self.self_attn
        q, k, v = _compiled(self, "_project", self)(x, _offset(self, cache))
        return _compiled(self, "_finish", self)(x, attn.attend(q, k, v, mask, cache))

    def _project(self, x, offset):
        norm = _inference(self).norm
        return self.self_attn.project(norm(self.input_layernorm, x), offset)

    def _finish(self, x, attended):
        kernels = _inference(self)
        h = x + kernels.linear(self.self_attn.o_proj, attended)
        return h + self.mlp(kernels.norm(self.post_attention_layernorm, h))


def _position(cache):
    """Where the next key goes: an int, or one per row for a batch's caches."""
    return getattr(cache, "positions", None) or cache.offset


def _compiles(module: nn.Module) -> bool:
    return not module.training and module.kernels.compiled


def _offset(module: nn.Module, cache):
    """The cache's position as `_compiled` pieces take it: an array (one trace for
    every position), else as `_position` gives it."""
    position = _position(cache)
    return mx.array(position, mx.int32) if _compiles(module) else position


def _compiled(module: nn.Module, name: str, params: nn.Module | list[nn.Module]):
    """`module.<name>`, through `mx.compile` where its kernels compile (MLX's generic
    ones, at inference): one trace per input shape, then one call runs the piece's
    whole graph, with its elementwise ops fused. `params` are the piece's weights,
    passed in on every call so that updated or quantized weights are used."""
    fn = getattr(module, name)
    if not _compiles(module):
        return fn
    compiled = module.__dict__.get("_compiled_" + name)
    if compiled is None:
        compiled = mx.compile(fn, inputs=params)
        object.__setattr__(module, "_compiled_" + name, compiled)
    return compiled


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
        caches = []
        context_window = context_window or self.context_window
        for layer in self.layers:
            window = context_window
            if layer.layer_type == "sliding_attention":
                own = (self.args.sliding_window or 1) - 1  # checked at load
                window = own if window is None else min(window, own)
            caches.append(KVCache() if window is None else WindowedKVCache(window))
        return caches

    def absorb(self, features: mx.array, cache: list[KVCache], counts=None):
        """Feed fused target features of newly committed tokens into the context
        cache (a batch's caches: row b takes its first counts[b])."""
        ctx = _compiled(self, "_context", [self.fc, self.hidden_norm])(features)
        for layer, c in zip(self.layers, cache, strict=True):
            layer.self_attn.absorb(ctx, c)
            if counts is not None:
                c.commit(counts)

    def _context(self, features: mx.array) -> mx.array:
        kernels = _inference(self)
        ctx = kernels.linear(self.fc, features.astype(self.dtype))
        return kernels.norm(self.hidden_norm, ctx)

    def _final_norm(self, h: mx.array) -> mx.array:
        return _inference(self).norm(self.norm, h)

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
        return _compiled(self, "_final_norm", self.norm)(h)

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
