"""The target side: one forward that yields logits AND the fused layer features the
drafter needs, plus exact rollback of the target cache after a partly rejected block.

We run the decoder layers ourselves (same calls, same order as mlx-lm's model code)
instead of patching library classes. Attention layers are called as-is, except that on
the CPU llama/qwen2/qwen3 blocks are mirrored here with `cpu_ops`' kernels; GatedDeltaNet
(linear attention) mixers are evaluated here so their recurrence inputs can be kept
and replayed over the accepted prefix, which restores the recurrent and conv states
exactly without a second target forward.
"""

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.base import create_attention_mask, create_ssm_mask
from mlx_lm.models.cache import KVCache, RotatingKVCache
from mlx_lm.models.gated_delta import gated_delta_update, normalize_qk

from . import cpu_ops

SUPPORTED_MODEL_TYPES = (
    "llama",
    "qwen2",
    "qwen3",
    "qwen3_moe",
    "qwen3_5",
    "qwen3_5_moe",
    "gemma4",
    "gemma4_text",
    "gpt_oss",
)
_GEMMA4 = ("gemma4", "gemma4_text")


def _text_parts(model: nn.Module):
    """(language model with the head, inner model with embed_tokens/layers/norm)."""
    lm = getattr(model, "language_model", model)
    inner = getattr(lm, "model", None)
    if (
        inner is None
        or not hasattr(inner, "layers")
        or not hasattr(inner, "embed_tokens")
    ):
        raise ValueError(
            f"Unsupported target {type(model).__module__}: expected an mlx-lm text model "
            f"with model.embed_tokens/layers/norm. Supported: {', '.join(SUPPORTED_MODEL_TYPES)}."
        )
    return lm, inner


def model_type(model: nn.Module) -> str:
    args = getattr(model, "args", None)
    return (
        getattr(args, "model_type", None) or type(model).__module__.rsplit(".", 1)[-1]
    )


@dataclass
class _DeltaRecord:
    """What one GatedDeltaNet layer needs to replay its recurrence over a prefix."""

    conv_input: mx.array  # [conv state before the block; block inputs]
    state: mx.array | None  # recurrent state before the block
    q: mx.array
    k: mx.array
    v: mx.array
    a: mx.array
    b: mx.array
    mask: mx.array | None
    mixer: nn.Module


def _gated_delta_mixer(mixer, x, mask, cache, tape: list | None):
    # Mirrors mlx_lm.models.qwen3_5.GatedDeltaNet.__call__ (single device), keeping the
    # recurrence inputs when a tape is given.
    B, S, _ = x.shape
    qkv = mixer.in_proj_qkv(x)
    z = mixer.in_proj_z(x).reshape(B, S, mixer.num_v_heads, mixer.head_v_dim)
    b = mixer.in_proj_b(x)
    a = mixer.in_proj_a(x)
    if cache is not None and cache[0] is not None:
        conv_state = cache[0]
    else:
        conv_state = mx.zeros(
            (B, mixer.conv_kernel_size - 1, mixer.conv_dim), dtype=x.dtype
        )
    if mask is not None:
        qkv = mx.where(mask[..., None], qkv, 0)
    conv_input = mx.concatenate([conv_state, qkv], axis=1)
    if cache is not None:
        cache[0] = mx.contiguous(conv_input[:, -(mixer.conv_kernel_size - 1) :, :])
    conv_out = nn.silu(mixer.conv1d(conv_input))
    q, k, v = [
        t.reshape(B, S, h, d)
        for t, h, d in zip(
            mx.split(conv_out, [mixer.key_dim, 2 * mixer.key_dim], -1),
            [mixer.num_k_heads, mixer.num_k_heads, mixer.num_v_heads],
            [mixer.head_k_dim, mixer.head_k_dim, mixer.head_v_dim],
        )
    ]
    state = cache[1] if cache else None
    q, k = normalize_qk(q, k, inv_scale=mixer.head_k_dim**-0.5, eps=1e-6)
    if tape is not None:
        tape.append(_DeltaRecord(conv_input, state, q, k, v, a, b, mask, mixer))
    out, state = gated_delta_update(
        q,
        k,
        v,
        a,
        b,
        mixer.A_log,
        mixer.dt_bias,
        state,
        mask,
        use_kernel=not mixer.training,
    )
    if cache is not None:
        cache[1] = state
        cache.advance(S)
    out = mixer.norm(out, z)
    return mixer.out_proj(out.reshape(B, S, -1))


def _gated_delta_layer(layer, x, mask, cache, tape):
    h = x + _gated_delta_mixer(
        layer.linear_attn, layer.input_layernorm(x), mask, cache, tape
    )
    return h + layer.mlp(layer.post_attention_layernorm(h))


_STANDARD_BLOCKS = ("llama", "qwen2", "qwen3")  # pre-norm attention + SwiGLU MLP blocks


def _is_standard_block(layer) -> bool:
    attn, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
    return all(
        hasattr(attn, a) for a in ("q_proj", "k_proj", "v_proj", "o_proj", "rope")
    ) and all(hasattr(mlp, a) for a in ("gate_proj", "up_proj", "down_proj"))


def _shared_rope(layers, standard) -> tuple | None:
    """(dims, base, scale) when every standard layer rotates its whole heads with the same
    plain `nn.RoPE`, so one `cpu_ops.rope_table` per forward serves them all; else None."""
    params = set()
    for layer, ok in zip(layers, standard):
        if not ok:
            continue
        attn = layer.self_attn
        rope, head_dim = attn.rope, attn.q_proj.weight.shape[0] // attn.n_heads
        if not isinstance(rope, nn.RoPE) or rope.traditional or rope.dims != head_dim:
            return None
        params.add((rope.dims, rope.base, rope.scale))
    return params.pop() if len(params) == 1 else None


def _standard_block(layer, x, mask, cache, rope_table=None):
    # Mirrors mlx_lm's llama/qwen2/qwen3 TransformerBlock.__call__, with cpu_ops'
    # attention, SwiGLU and rotary tables, which cost less on the CPU.
    attn, mlp = layer.self_attn, layer.mlp
    h = layer.input_layernorm(x)
    B, L, _ = h.shape
    q = attn.q_proj(h).reshape(B, L, attn.n_heads, -1)
    k = attn.k_proj(h).reshape(B, L, attn.n_kv_heads, -1)
    v = attn.v_proj(h).reshape(B, L, attn.n_kv_heads, -1).transpose(0, 2, 1, 3)
    if hasattr(attn, "q_norm"):
        q, k = attn.q_norm(q), attn.k_norm(k)
    if rope_table is not None:
        q = cpu_ops.rope(q, rope_table).transpose(0, 2, 1, 3)
        k = cpu_ops.rope(k, rope_table).transpose(0, 2, 1, 3)
    else:
        q = attn.rope(q.transpose(0, 2, 1, 3), offset=cache.offset)
        k = attn.rope(k.transpose(0, 2, 1, 3), offset=cache.offset)
    k, v = cache.update_and_fetch(k, v)
    out = cpu_ops.attention(q, k, v, attn.scale, mask)
    h = x + attn.o_proj(out.transpose(0, 2, 1, 3).reshape(B, L, -1))
    y = layer.post_attention_layernorm(h)
    return h + mlp.down_proj(cpu_ops.swiglu(mlp.gate_proj(y), mlp.up_proj(y)))


def _call_layer(layer, x, mask, cache, rope_table=None):
    return layer(x, mask, cache)


def _sliding_windows(inner, layers) -> list:
    """Per layer: its attention window if it is a sliding-window layer, else None."""
    window = getattr(inner, "window_size", None) or getattr(
        inner, "sliding_window", None
    )
    types = getattr(inner, "layer_types", None) or []
    out = []
    for i, layer in enumerate(layers):
        sliding = getattr(layer, "use_sliding", None)
        if sliding is None:
            kind = getattr(layer, "layer_type", types[i] if i < len(types) else None)
            sliding = kind == "sliding_attention"
        out.append(window if sliding else None)
    return out


class Target:
    """An mlx-lm model seen as a DFlash target."""

    def __init__(self, model: nn.Module, feature_layer_ids: Sequence[int] = ()):
        self.model = model
        self.model_type = model_type(model)
        if self.model_type not in SUPPORTED_MODEL_TYPES:
            raise ValueError(
                f"DFlash does not support '{self.model_type}' targets yet. "
                f"Supported: {', '.join(SUPPORTED_MODEL_TYPES)}."
            )
        self.lm, self.inner = _text_parts(model)
        self.layers = list(self.inner.layers)
        self.feature_layer_ids = tuple(int(i) for i in feature_layer_ids)
        bad = [i for i in self.feature_layer_ids if not 0 <= i < len(self.layers)]
        if bad:
            raise ValueError(
                f"Drafter reads target layers {list(self.feature_layer_ids)} but the "
                f"{self.model_type} target has {len(self.layers)} layers (0..{len(self.layers) - 1}): "
                "use the drafter trained for this target."
            )
        self._linear = [bool(getattr(l, "is_linear", False)) for l in self.layers]
        self.recurrent = any(self._linear)  # rollback needs a tape of the verify pass
        self._windows = _sliding_windows(self.inner, self.layers)
        # On the CPU, standard blocks run through cpu_ops (same math, cheaper exp and rope).
        self._standard = [
            cpu_ops.enabled()
            and self.model_type in _STANDARD_BLOCKS
            and _is_standard_block(l)
            for l in self.layers
        ]
        self._rope = _shared_rope(self.layers, self._standard)
        self.embed_tokens = self.inner.embed_tokens
        self.embed_scale = getattr(self.inner, "embed_scale", 1.0)
        self.softcap = getattr(self.lm, "final_logit_softcapping", None)

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    @property
    def hidden_size(self) -> int:
        return self.inner.norm.weight.shape[0]

    @property
    def vocab_size(self) -> int:
        return self.embed_tokens.weight.shape[0]

    @property
    def dtype(self):
        return self.inner.norm.weight.dtype

    def make_cache(self) -> list[Any]:
        """Per-layer caches that can all be rolled back (rotating caches become plain KV)."""
        make = getattr(self.model, "make_cache", None)
        cache = make() if make else [KVCache() for _ in self.layers]
        return [KVCache() if isinstance(c, RotatingKVCache) else c for c in cache]

    def embed(self, tokens: mx.array) -> mx.array:
        h = self.embed_tokens(tokens)
        return h * self.embed_scale if self.embed_scale != 1.0 else h

    def logits(self, hidden: mx.array) -> mx.array:
        """The target's LM head on final-normed hidden states."""
        head = getattr(self.lm, "lm_head", None)
        logits = (
            head(hidden) if head is not None else self.embed_tokens.as_linear(hidden)
        )
        return self.softcapped(logits)

    def softcapped(self, logits: mx.array) -> mx.array:
        """The target's final logit soft-capping (identity for most families)."""
        if self.softcap:
            logits = mx.tanh(logits / self.softcap) * self.softcap
        return logits

    def __call__(self, tokens: mx.array, cache: list[Any], tape: list | None = None):
        """Run the layers on `tokens` (1, L): (final-normed hidden, fused features or None).

        With a `tape`, GatedDeltaNet layers append what `rollback` needs to it.
        """
        if self.model_type in _GEMMA4:
            return self._gemma4(tokens, cache)
        h = self.embed(tokens)
        masks: dict = {}
        rope_table = None
        if self._rope is not None:
            offset = cache[self._standard.index(True)].offset
            rope_table = cpu_ops.rope_table(*self._rope, offset, tokens.shape[1])
        wanted = set(self.feature_layer_ids)
        outputs = {}
        for i, (layer, c) in enumerate(zip(self.layers, cache)):
            if self._linear[i]:
                if "ssm" not in masks:
                    masks["ssm"] = create_ssm_mask(h, c)
                h = _gated_delta_layer(layer, h, masks["ssm"], c, tape)
            else:
                key = self._windows[i]
                if key not in masks:
                    # cpu_ops takes boolean masks, built once here for every layer;
                    # prefill chunks keep mlx-lm's "causal" (MLX's kernel builds its own)
                    as_array = (
                        self._standard[i] and 1 < h.shape[1] <= cpu_ops.MAX_QUERY_ROWS
                    )
                    masks[key] = create_attention_mask(
                        h, c, window_size=key, return_array=as_array
                    )
                block = _standard_block if self._standard[i] else _call_layer
                h = block(layer, h, masks[key], c, rope_table)
            if i in wanted:
                outputs[i] = h
        return self.inner.norm(h), self._fuse(outputs)

    def _fuse(self, outputs: dict):
        features = [outputs[i] for i in self.feature_layer_ids]
        return mx.concatenate(features, axis=-1) if features else None

    def _gemma4(self, tokens, cache):
        # Mirrors mlx_lm.models.gemma4_text.Gemma4TextModel.__call__: per-layer inputs and
        # KV sharing (later layers reuse an earlier layer's keys/values from this forward).
        inner, n = self.inner, len(self.layers)
        embeddings = self.embed_tokens(tokens)
        h = embeddings * inner.embed_scale
        per_layer = [None] * n
        if inner.hidden_size_per_layer_input:
            inputs = inner._project_per_layer_inputs(
                h, inner._get_per_layer_inputs(tokens, embeddings)
            )
            per_layer = [inputs[:, :, i, :] for i in range(n)]
        cache = list(cache) + [None] * (n - len(cache))
        masks = inner._make_masks(h, cache)
        shared = [(None, None)] * n
        wanted, outputs = set(self.feature_layer_ids), {}
        for i, (layer, c) in enumerate(zip(self.layers, cache)):
            kvs, offset = shared[inner.previous_kvs[i]]
            h, kvs, offset = layer(
                h,
                masks[i],
                c,
                per_layer_input=per_layer[i],
                shared_kv=kvs,
                offset=offset,
            )
            shared[i] = (kvs, offset)
            if i in wanted:
                outputs[i] = h
        return inner.norm(h), self._fuse(outputs)

    def rollback(self, cache: list[Any], tape: list, processed: int, keep: int):
        """Undo the last forward of `processed` tokens except its first `keep`."""
        drop = processed - keep
        if drop <= 0:
            return
        records = iter(tape)
        for linear, c in zip(self._linear, cache):
            if not linear:
                c.trim(drop)
                continue
            r = next(records)
            if keep == 0:
                state = r.state
            else:
                m = r.mixer
                mask = None if r.mask is None else r.mask[:, :keep]
                _, state = gated_delta_update(
                    r.q[:, :keep],
                    r.k[:, :keep],
                    r.v[:, :keep],
                    r.a[:, :keep],
                    r.b[:, :keep],
                    m.A_log,
                    m.dt_bias,
                    r.state,
                    mask,
                    use_kernel=not m.training,
                )
            n_conv = r.conv_input.shape[1] - processed
            c[0] = mx.contiguous(r.conv_input[:, keep : keep + n_conv])
            c[1] = state
