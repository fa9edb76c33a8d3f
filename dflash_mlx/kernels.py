"""The few ops whose kernels differ by device, chosen once per target or drafter.

MLX's own ops everywhere, except on the CPU where MLX can compile them: there `cpu_ops`'
fused exp makes softmax, SwiGLU and small-block attention cheaper (see cpu_ops.py), and
on an OpenBLAS with small-matrix kernels the 1-3 token products of the target and the
drafter run on them (see cpu_gemm.py).
"""

from collections.abc import Callable
from dataclasses import dataclass

import mlx.core as mx
import mlx.nn as nn

from .cpu_gemm import (
    apply_linear,
    apply_pair,
    blocked_linear,
    blocked_pair,
    native_linear,
    native_pair,
    small_kernels,
)


@dataclass(frozen=True)
class Kernels:
    name: str
    swiglu: Callable[[mx.array, mx.array], mx.array]  # silu(gate) * up
    softmax: Callable[[mx.array], mx.array]  # over the last axis, in float32
    # (q, k, v, scale, mask) as for mx.fast.scaled_dot_product_attention
    attention: Callable[..., mx.array]
    # target blocks on cpu_blocks.py, qwen3_5 recurrent mixers on cpu_delta.py
    cpu_blocks: bool
    # (linear layer or tied embedding, x): the target's MLP projections and LM head
    linear: Callable[[nn.Module, mx.array], mx.array] = apply_linear
    # (first, second, x) -> (first(x), second(x)): the MLP's gate and up
    linear_pair: Callable[[nn.Module, nn.Module, mx.array], tuple] = apply_pair


def _mlx_attention(q, k, v, scale, mask=None):
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

        linear, pair = apply_linear, apply_pair
        if native.load() is not None:
            linear, pair = native_linear, native_pair
        elif small_kernels():
            linear, pair = blocked_linear, blocked_pair
        return Kernels(
            name="cpu_ops",
            swiglu=cpu_ops.swiglu,
            softmax=cpu_ops.softmax,
            attention=cpu_ops.attention,
            cpu_blocks=True,
            linear=linear,
            linear_pair=pair,
        )
    return MLX
