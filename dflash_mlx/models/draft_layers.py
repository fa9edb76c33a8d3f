"""The drafter's layers (Qwen3-style attention and MLP over a context KV cache) and
the helper that runs their shape-stable pieces through `mx.compile`."""

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.cache import KVCache
from mlx_lm.models.rope_utils import initialize_rope

from ..kernels import MLX, ForwardTables, Kernels
from .cache import WindowedKVCache
from .draft_config import ModelArgs


def inference_kernels(module: nn.Module) -> Kernels:
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
        kernels = inference_kernels(self)
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
        kernels = inference_kernels(self)
        if kernels.rope is not None and self.tables is not None:
            return kernels.rope(x, self.tables.get(offset, x.shape[1]))
        if isinstance(offset, tuple):
            offset = mx.array(offset)
        return self.rope(x.transpose(0, 2, 1, 3), offset=offset)

    def _keys_values(self, x, offset):
        B, L, _ = x.shape
        kernels = inference_kernels(self)
        k = kernels.linear(self.k_proj, x).reshape(B, L, self.n_kv_heads, -1)
        k = kernels.norm(self.k_norm, k)
        v = kernels.linear(self.v_proj, x).reshape(B, L, self.n_kv_heads, -1)
        return self._rotate(k, offset), v.transpose(0, 2, 1, 3)

    def absorb(self, ctx: mx.array, cache: KVCache):
        """Append the context's keys/values (at their absolute positions) to the
        cache."""
        keys_values = compiled_piece(self, "_keys_values", self)
        cache.update_and_fetch(*keys_values(ctx, _offset(self, cache)))
        if isinstance(cache, WindowedKVCache):
            cache.evict()

    def project(self, x, offset):
        """Rotated queries, keys and values (B, H, L, D) of x at positions offset.."""
        B, L, _ = x.shape
        kernels = inference_kernels(self)
        q = kernels.linear(self.q_proj, x).reshape(B, L, self.n_heads, -1)
        q = self._rotate(kernels.norm(self.q_norm, q), offset)
        return (q, *self._keys_values(x, offset))

    def attend(self, q, k, v, mask, cache) -> mx.array:
        """Attention of the block's queries over the cache and the block (B, L, H*D),
        before the output projection."""
        keys, values = cache.update_and_fetch(k, v)
        out = inference_kernels(self).attention(q, keys, values, self.scale, mask)
        return out.transpose(0, 2, 1, 3).reshape(q.shape[0], q.shape[2], -1)

    def __call__(self, x, mask, cache: KVCache):
        q, k, v = compiled_piece(self, "project", self)(x, _offset(self, cache))
        return inference_kernels(self).linear(
            self.o_proj, self.attend(q, k, v, mask, cache)
        )


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
        q, k, v = compiled_piece(self, "_project", self)(x, _offset(self, cache))
        return compiled_piece(self, "_finish", self)(
            x, attn.attend(q, k, v, mask, cache)
        )

    def _project(self, x, offset):
        norm = inference_kernels(self).norm
        return self.self_attn.project(norm(self.input_layernorm, x), offset)

    def _finish(self, x, attended):
        kernels = inference_kernels(self)
        h = x + kernels.linear(self.self_attn.o_proj, attended)
        return h + self.mlp(kernels.norm(self.post_attention_layernorm, h))


def _position(cache):
    """Where the next key goes: an int, or one per row for a batch's caches."""
    return getattr(cache, "positions", None) or cache.offset


def _compiles(module: nn.Module) -> bool:
    return not module.training and module.kernels.compiled


def _offset(module: nn.Module, cache):
    """The cache's position as `compiled_piece` pieces take it: an array (one trace for
    every position), else as `_position` gives it."""
    position = _position(cache)
    return mx.array(position, mx.int32) if _compiles(module) else position


def compiled_piece(module: nn.Module, name: str, params: nn.Module | list[nn.Module]):
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
