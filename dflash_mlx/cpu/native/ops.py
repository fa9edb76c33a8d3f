"""The native kernels as the CPU's kernels (see cpu.kernels): each applies
where its compiled op does (float32, a decoding step or a verify block) and hands
anything else to the kernel it stands in for."""

import mlx.core as mx
import mlx.nn as nn

from ...kernels import RaggedMask, WindowMask, apply_linear
from .. import ops as cpu_ops
from . import load

# measured on the demo target: from 16 tokens OpenBLAS's packed products catch up
MAX_TOKENS = 16


def linear(module: nn.Module, x: mx.array) -> mx.array:
    """`module(x)` (or a tied embedding's `as_linear(x)`), on `small_linear` for a
    dense layer (float32 or half weights) on at most MAX_TOKENS float32 tokens."""
    if not _dense(module) or not _applies(x, module.weight):
        return apply_linear(module, x)
    y = _kernels().small_linear(x, module.weight)
    bias = getattr(module, "bias", None) if type(module) is nn.Linear else None
    return y if bias is None else y + bias


def gated(gate: nn.Module, up: nn.Module, x: mx.array) -> mx.array:
    """silu(gate(x)) * up(x), on `gated_linear` for bias-free dense layers."""
    fused = (
        type(gate) is type(up) is nn.Linear
        and "bias" not in gate
        and "bias" not in up
        and _applies(x, gate.weight)
        and up.weight.dtype in WEIGHT_TYPES
    )
    if not fused:
        return cpu_ops.swiglu(linear(gate, x), linear(up, x))
    return _kernels().gated_linear(x, gate.weight, up.weight)


def norm(module: nn.Module, x: mx.array) -> mx.array:
    """`module(x)`, on `rms_norm` for an `nn.RMSNorm` over float32 rows (any
    number: each row is normed alone)."""
    if (
        type(module) is not nn.RMSNorm
        or not x.dtype == module.weight.dtype == mx.float32
    ):
        return module(x)
    return _kernels().rms_norm(x, module.weight, module.eps)


def rope(x: mx.array, table) -> mx.array:
    """(B, L, H, D) queries or keys rotated with a `cpu.ops.rope_table`, as the
    (B, H, L, D) heads attention reads (`cpu.ops.rope` then a transpose)."""
    if x.dtype != mx.float32:
        return cpu_ops.rope_heads(x, table)
    return _kernels().rope(x, *table)


def attention(q, k, v, scale: float, mask=None) -> mx.array:
    """`cpu.ops.attention` (same arguments, (B, H, T, D) out), on `block_attention`
    for float32 queries (a verify block, or a prefill chunk: ~7x MLX's CPU kernel on
    133 queries over 3.2K keys, measured) with no mask, a causal one or a
    `WindowMask`, or a batch's `RaggedMask` (`ragged_attention`)."""
    kernels = _kernels()
    causal = isinstance(mask, str) and mask == "causal"
    if (
        not (mask is None or causal or isinstance(mask, (WindowMask, RaggedMask)))
        or not kernels.attention_fits(q.shape[-1])
        or not all(a.dtype == mx.float32 for a in (q, k, v))
    ):
        return cpu_ops.attention(q, k, v, scale, mask)
    if isinstance(mask, RaggedMask):
        out = kernels.ragged_attention(q, k, v, scale, list(mask.visible))
    elif isinstance(mask, WindowMask):
        out = kernels.block_attention(q, k, v, scale, mask.causal, mask.skip)
    else:
        out = kernels.block_attention(q, k, v, scale, causal)
    return out.transpose(0, 2, 1, 3)  # (B, T, H, D) in memory: reshapes for free


def _dense(module: nn.Module) -> bool:
    # exact types only: quantized layers are not dense products, and sharded
    # layers' subclasses add collectives around theirs
    return type(module) in (nn.Linear, nn.Embedding)


WEIGHT_TYPES = (mx.float32, mx.float16, mx.bfloat16)


def _applies(x: mx.array, weight: mx.array) -> bool:
    """float32 inputs of at most MAX_TOKENS tokens a sequence (the rows of a batch's
    verify step are its sequences' blocks), float32 or half weights."""
    tokens = x.shape[-2] if x.ndim >= 3 else x.size // max(x.shape[-1], 1)
    return (
        x.dtype == mx.float32 and weight.dtype in WEIGHT_TYPES and tokens <= MAX_TOKENS
    )


def _kernels():
    module = load()
    if module is None:
        raise RuntimeError(
            "dflash_mlx.cpu.native.ops needs the native kernels (load())"
        )
    return module
