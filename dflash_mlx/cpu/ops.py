"""Attention, softmax, SwiGLU and rotary embeddings that cost less on MLX's CPU backend.

On the CPU, MLX evaluates `exp` one element at a time (~12 ns each), so the softmax of
block attention and the sigmoid of SwiGLU, whose work grows with the number of tokens
verified at once, cost a block-8 verify of a small target ~15 ms more than a plain step.
Here `exp` is a polynomial of vectorizable ops fused by `mx.compile`: 2-3x faster and
within 1e-7 relative (MLX's own CPU exp: 4e-6). Rotary embeddings take one table per
forward (`rope_table`) instead of MLX's per-call one.

These are CPU kernels only: `backend.for_device` picks them once, when a target or a
drafter is built, and only on the CPU where MLX can compile them (`available()`); the
Metal/CUDA path never reaches this module.
"""

from functools import cache

import mlx.core as mx
import numpy as np

from ..kernels import RaggedMask, WindowMask

_LOG2E = 1.4426950408889634
_LN2_HI = 0.693145751953125  # ln 2 split in two so n * ln2 stays exact (Cody-Waite)
_LN2_LO = 1.428606765330187e-06
_ROUNDER = 12582912.0  # 1.5 * 2**23: adding it rounds |y| < 2**22 to an integer
_EXP_MIN, _EXP_MAX = -87.3, 88.7  # float32 exp underflows / overflows past these


def _exp(x: mx.array) -> mx.array:
    """exp(x) = e^r * 2^n with |r| <= ln2/2, e^r by its degree-7 Taylor polynomial."""
    xc = mx.clip(x, _EXP_MIN, _EXP_MAX)
    # round to nearest by the 1.5 * 2**23 trick: two adds, where MLX's CPU floor is a
    # scalar call that cost 45% of this function
    n = (xc * _LOG2E + _ROUNDER) - _ROUNDER
    r = xc - n * _LN2_HI - n * _LN2_LO
    p = r * (1 / 5040) + 1 / 720
    for c in (1 / 120, 1 / 24, 1 / 6, 0.5, 1.0, 1.0):
        p = p * r + c
    y = p * mx.left_shift(n.astype(mx.int32) + 127, 23).view(mx.float32)
    return mx.where(x < _EXP_MIN, 0.0, mx.where(x > _EXP_MAX, mx.inf, y))


# Fused kernels. Not shapeless (a bit-cast's shape cannot be inferred then): a new shape
# costs a re-trace, the C++ kernel itself is shape-generic and compiled once.
@mx.compile
def _swiglu(gate: mx.array, up: mx.array) -> mx.array:
    g = gate.astype(mx.float32)
    return (g * up / (1.0 + _exp(-g))).astype(gate.dtype)


@mx.compile
def _scaled_exp(x: mx.array, row_max: mx.array, scale: mx.array) -> mx.array:
    return _exp((x - row_max) * scale)


@mx.compile
def _rotate(x: mx.array, cos: mx.array, sin: mx.array) -> mx.array:
    half = x.shape[-1] // 2
    return x * cos + mx.concatenate([x[..., half:], x[..., :half]], axis=-1) * sin


@cache
def available() -> bool:
    """True when MLX can compile CPU kernels here (it needs a C++ compiler)."""
    try:
        with mx.stream(mx.cpu):
            mx.eval(_swiglu(mx.zeros((2,)), mx.zeros((2,))))
        return True
    except Exception:  # no C++ compiler for MLX's CPU JIT: keep MLX's own ops
        return False


def swiglu(gate: mx.array, up: mx.array) -> mx.array:
    """silu(gate) * up."""
    return _swiglu(gate, up)


def rope_table(dims: int, base: float, scale: float, offset, length: int):
    """cos and sign-folded sin, (length, 1, dims), to rotate (B, length, H, dims)
    inputs at positions offset.. the way `mx.fast.rope(traditional=False)` does, in the
    same float32 steps. MLX's CPU rope rebuilds these in every call (~75 us, 60 calls
    per forward of a 30-layer model); one table serves every layer of a forward.

    `offset` may be one offset per row of a batch (a tuple): the tables are then
    (B, length, 1, dims), each row's the same numbers as its own table."""
    half = dims // 2
    log_step = np.float32(np.log(np.float32(base))) / np.float32(half)
    inv_freq = mx.exp(
        mx.arange(0, -half, -1, dtype=mx.float32) * mx.array(float(log_step))
    )
    steps = mx.arange(length, dtype=mx.float32)
    if isinstance(offset, tuple):
        steps = steps[None] + mx.array(offset, mx.float32)[:, None]
    else:
        steps = steps + offset
    angles = (steps * mx.array(scale, mx.float32))[..., None] * inv_freq
    cos, sin = mx.cos(angles), mx.sin(angles)
    cos = mx.concatenate([cos, cos], -1)[..., None, :]
    return cos, mx.concatenate([-sin, sin], -1)[..., None, :]


def rope(x: mx.array, table) -> mx.array:
    """Rotate (B, L, H, dims) `x` with a `rope_table`."""
    cos, sin = table
    return _rotate(x, cos.astype(x.dtype), sin.astype(x.dtype))


def rope_heads(x: mx.array, table) -> mx.array:
    """`rope`, as the (B, H, L, dims) heads attention reads."""
    return rope(x, table).transpose(0, 2, 1, 3)


def softmax(x: mx.array, axis: int = -1) -> mx.array:
    """Softmax along `axis`, computed and returned in float32."""
    x = x.astype(mx.float32)
    e = _scaled_exp(x, x.max(axis=axis, keepdims=True), mx.array(1.0))
    return e / e.sum(axis=axis, keepdims=True)


MAX_QUERY_ROWS = 64  # verify-sized blocks; longer prefill chunks use MLX's kernel


def attention(
    q: mx.array,
    k: mx.array,
    v: mx.array,
    scale: float,
    mask: "mx.array | str | WindowMask | RaggedMask | None" = None,
) -> mx.array:
    """Scaled dot-product attention of (B, H, T, D) queries over (B, Hkv, S, D) keys and
    values; `mask` as for `mx.fast.scaled_dot_product_attention` or a
    `kernels.WindowMask`. Ours takes None, "causal" or a boolean (T, S) mask (True = may
    attend) and hands anything else to MLX's kernel."""
    if isinstance(mask, (WindowMask, RaggedMask)):
        mask = mask.array(q.shape[2], k.shape[2])
    return _attention(q, k, v, scale, mask)


def _attention(q, k, v, scale: float, mask: mx.array | str | None) -> mx.array:
    rows = q.shape[2]
    if isinstance(mask, str) and mask == "causal" and 4 <= rows <= MAX_QUERY_ROWS:
        from mlx_lm.models.base import create_causal_mask

        mask = create_causal_mask(rows, k.shape[2] - rows)
    own_mask = mask is None or (
        isinstance(mask, mx.array) and mask.ndim == 2 and mask.dtype == mx.bool_
    )
    if not 4 <= rows <= MAX_QUERY_ROWS or not own_mask:
        # Up to 3 query rows MLX's own kernel is as cheap (measured); prefill chunks
        # keep it too, as ours holds several score-sized arrays at once.
        return mx.fast.scaled_dot_product_attention(q, k, v, scale=scale, mask=mask)
    B, H, T, D = q.shape
    Hkv, S = k.shape[1], k.shape[2]
    groups = H // Hkv
    # Query heads h*groups..(h+1)*groups-1 share kv head h: one matmul per kv head.
    scores = (q.reshape(B, Hkv, groups * T, D) @ k.swapaxes(-1, -2)).astype(mx.float32)
    if isinstance(mask, mx.array):
        scores = mx.where(mask, scores.reshape(B, Hkv, groups, T, S), -mx.inf)
        scores = scores.reshape(B, Hkv, groups * T, S)
    weights = _scaled_exp(
        scores, scores.max(axis=-1, keepdims=True), mx.array(scale, mx.float32)
    )
    out = (weights.astype(v.dtype) @ v) / weights.sum(axis=-1, keepdims=True).astype(
        v.dtype
    )
    return out.reshape(B, H, T, D)
