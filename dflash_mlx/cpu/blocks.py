"""Standard decoder blocks (llama, qwen2, qwen3) computed with the CPU's kernels.

The one place that mirrors mlx-lm model code: `TransformerBlock.__call__` of mlx-lm's
llama, qwen2 and qwen3 (pre-norm attention with optional q/k norms, then a SwiGLU MLP).
It calls the layer's own submodules in the same order, so quantized weights and sharded
layers (whose all-reduces live inside `o_proj`/`down_proj`) keep working. Plain decoding
through it is ~1.1x mlx-lm's on a CPU (cheaper exp and one rotary table per forward).
tests/test_cpu_blocks.py compares it with mlx-lm's own forward on each family, so a
change in mlx-lm's block fails there. On a quantized KV cache (mlx-lm's
`QuantizedKVCache`), the attention is mlx-lm's `quantized_scaled_dot_product_attention`
and everything around it stays on these kernels (so its keys, quantized per token,
are the same bits in a verify block as in a step).
"""

import mlx.nn as nn

from ..kernels import ForwardTables, Kernels, RaggedMask, shared_rope

FAMILIES = ("llama", "qwen2", "qwen3")


def is_standard_block(layer) -> bool:
    attn, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
    names = ("q_proj", "k_proj", "v_proj", "o_proj", "rope", "n_heads", "n_kv_heads")
    return all(hasattr(attn, a) for a in names) and all(
        hasattr(mlp, a) for a in ("gate_proj", "up_proj", "down_proj")
    )


class CpuBlock:
    """Stands in for one mlx-lm standard block; same inputs, same output."""

    def __init__(self, layer: nn.Module, tables: ForwardTables, kernels: Kernels):
        self.layer = layer
        self.tables = tables
        self.kernels = kernels  # products and attention (Kernels)

    def __getattr__(self, name):
        return getattr(self.__dict__["layer"], name)

    def __call__(self, x, mask=None, cache=None):
        layer = self.layer
        if cache is None:
            return layer(x, mask, cache)
        attn, mlp = layer.self_attn, layer.mlp
        kernels = self.kernels
        h = kernels.norm(layer.input_layernorm, x)
        B, L, _ = h.shape
        # a batch of sequences (models/ragged.py): each row at its own position
        positions = getattr(cache, "positions", None)
        table = self.tables.get(cache.offset if positions is None else positions, L)
        linear = kernels.linear
        q = linear(attn.q_proj, h).reshape(B, L, attn.n_heads, -1)
        k = linear(attn.k_proj, h).reshape(B, L, attn.n_kv_heads, -1)
        v = linear(attn.v_proj, h).reshape(B, L, attn.n_kv_heads, -1)
        v = v.transpose(0, 2, 1, 3)
        if hasattr(attn, "q_norm"):
            q, k = kernels.norm(attn.q_norm, q), kernels.norm(attn.k_norm, k)
        if table is not None and kernels.rope is not None:
            q, k = kernels.rope(q, table), kernels.rope(k, table)
        else:
            q = attn.rope(q.transpose(0, 2, 1, 3), offset=cache.offset)
            k = attn.rope(k.transpose(0, 2, 1, 3), offset=cache.offset)
        k, v = cache.update_and_fetch(k, v)
        if positions is not None:
            mask = RaggedMask(cache.visible(L))
        if hasattr(cache, "bits"):
            out = _quantized_attention(q, k, v, attn.scale, mask, cache)
        else:
            out = kernels.attention(q, k, v, attn.scale, mask)
        h = x + linear(attn.o_proj, out.transpose(0, 2, 1, 3).reshape(B, L, -1))
        y = kernels.norm(layer.post_attention_layernorm, h)
        return h + linear(mlp.down_proj, kernels.gated(mlp.gate_proj, mlp.up_proj, y))


def _quantized_attention(q, k, v, scale, mask, cache):
    from mlx_lm.models.base import quantized_scaled_dot_product_attention

    return quantized_scaled_dot_product_attention(
        q, k, v, scale=scale, mask=mask, group_size=cache.group_size, bits=cache.bits
    )


def cpu_blocks(model_type: str, layers: list, kernels: Kernels) -> list | None:
    """CpuBlocks for every layer of a standard-family target; None unless all fit."""
    if model_type not in FAMILIES or not all(is_standard_block(la) for la in layers):
        return None
    tables = ForwardTables(shared_rope(layers), kernels.rope_table)
    return [CpuBlock(layer, tables, kernels) for layer in layers]
