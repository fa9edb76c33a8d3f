"""The few ops whose kernels differ by device, chosen once per target or drafter.

MLX's own ops everywhere, except on the CPU where MLX can compile them: there `cpu_ops`'
fused exp makes softmax, SwiGLU and small-block attention cheaper (see cpu_ops.py), the
native kernels (dflash_mlx/native) run the products, norms and attention of decoding
steps and verify blocks where they can be built, and otherwise, on an OpenBLAS with
small-matrix kernels, the 1-3 token products run on those (see cpu_gemm.py).
"""

from collections.abc import Callable
from dataclasses import dataclass, replace

import mlx.core as mx
import mlx.nn as nn

from .cpu_gemm import (
    apply_linear,
    apply_pair,
    blocked_linear,
    blocked_pair,
    small_kernels,
)


@dataclass(frozen=True)
class WindowMask:
    """A drafter block's mask as two numbers: query t of T sees the keys from
    `skip + t` on (a sliding window over the context) and, when `causal`, the block's
    keys up to its own. Kernels that take it read no mask array."""

    skip: int
    causal: bool = False

    def array(self, rows: int, keys: int) -> mx.array:
        """The boolean (rows, keys) mask it stands for (True: may attend)."""
        t = mx.arange(rows)[:, None]
        k = mx.arange(keys)[None]
        visible = k >= self.skip + t
        return visible & (k <= keys - rows + t) if self.causal else visible


@dataclass(frozen=True)
class Kernels:
    name: str
    swiglu: Callable[[mx.array, mx.array], mx.array]  # silu(gate) * up
    softmax: Callable[[mx.array], mx.array]  # over the last axis, in float32
    # (q, k, v, scale, mask) as for mx.fast.scaled_dot_product_attention; the mask
    # may also be a WindowMask
    attention: Callable[..., mx.array]
    # target blocks on cpu_blocks.py, qwen3_5 recurrent mixers on cpu_delta.py
    cpu_blocks: bool
    # (linear layer or tied embedding, x): the target's MLP projections and LM head
    linear: Callable[[nn.Module, mx.array], mx.array] = apply_linear
    # (first, second, x) -> (first(x), second(x)): the MLP's gate and up
    linear_pair: Callable[[nn.Module, nn.Module, mx.array], tuple] = apply_pair
    # (gate, up, x) -> silu(gate(x)) * up(x) as one kernel, where there is one
    fused_gate: Callable[[nn.Module, nn.Module, mx.array], mx.array] | None = None
    # (norm layer, x) -> norm(x): the RMSNorms of blocks and drafters
    norm: Callable[[nn.Module, mx.array], mx.array] = lambda module, x: module(x)
    # `linear` and `fused_gate` take float16/bfloat16 weights with float32 inputs
    half_weights: bool = False
    # ((B, L, H, D) x, cpu_ops.rope_table) -> rotated (B, H, L, D): the CPU blocks'
    rope: Callable[[mx.array, tuple], mx.array] | None = None

    def gated(self, gate: nn.Module, up: nn.Module, x: mx.array) -> mx.array:
        """silu(gate(x)) * up(x): a SwiGLU MLP's first half."""
        if self.fused_gate is not None:
            return self.fused_gate(gate, up, x)
        return self.swiglu(*self.linear_pair(gate, up, x))


def _mlx_attention(q, k, v, scale, mask=None):
    if isinstance(mask, WindowMask):
        mask = mask.array(q.shape[2], k.shape[2])
    return mx.fast.scaled_dot_product_attention(q, k, v, scale=scale, mask=mask)


MLX = Kernels(
    name="mlx",
    swiglu=lambda gate, up: nn.silu(gate) * up,
    softmax=lambda x: mx.softmax(x.astype(mx.float32), axis=-1),
    attention=_mlx_attention,
    cpu_blocks=False,
)


def for_device(device: mx.Device | None = None) -> Kernels:
    """The kernels for `device` (default: MLX's default device)."""
    from . import cpu_ops

    device = device or mx.default_device()
    if device == mx.cpu and cpu_ops.available():
        from . import native

        chosen = Kernels(
            name="cpu_ops",
            swiglu=cpu_ops.swiglu,
            softmax=cpu_ops.softmax,
            attention=cpu_ops.attention,
            cpu_blocks=True,
            rope=cpu_ops.rope_heads,
        )
        if native.load() is not None:
            from .native import ops

            return replace(
                chosen,
                attention=ops.attention,
                linear=ops.linear,
                fused_gate=ops.gated,
                norm=ops.norm,
                half_weights=True,
                rope=ops.rope,
            )
        if small_kernels():
            return replace(chosen, linear=blocked_linear, linear_pair=blocked_pair)
        return chosen
    return MLX
