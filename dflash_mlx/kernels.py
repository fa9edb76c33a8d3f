"""The few ops whose kernels differ by device: the interface, and MLX's own.

`Kernels` names what a target or drafter runs through (products, norms, attention,
rotary embeddings); `MLX` is MLX's generic kernels, right on every device.
`backend.for_device` picks the kernels once per target or drafter: these, or on the
CPU, where MLX's backend is slow, those of `dflash_mlx/cpu` (fused exp for softmax,
SwiGLU and small-block attention, native kernels for the products, norms and attention
of decoding steps and verify blocks, or OpenBLAS's small-matrix kernels). The CPU-only
stand-ins (target blocks, recurrent mixers, rotary tables) are reached through the
fields of `Kernels`, never imported: this module imports nothing from dflash_mlx.
"""

from collections.abc import Callable
from dataclasses import dataclass

import mlx.core as mx
import mlx.nn as nn


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
class RaggedMask:
    """The causal mask of a verify step over a batch of sequences of different
    lengths: batch row b sees its first `visible[b]` keys, the last T of them its
    block's (see models/ragged.py). Kernels that take it compute each row as if it
    were alone."""

    visible: tuple[int, ...]

    def array(self, rows: int, keys: int) -> mx.array:
        """The boolean (B, 1, rows, keys) mask it stands for (True: may attend)."""
        k = mx.arange(keys)[None, None, None]
        last = (
            mx.array(self.visible)[:, None, None, None]
            - rows
            + mx.arange(rows)[None, None, :, None]
        )
        return k <= last


def apply_linear(module: nn.Module, x: mx.array) -> mx.array:
    """`module(x)` for a linear layer; `module.as_linear(x)` for a (tied) embedding."""
    if isinstance(module, (nn.Embedding, nn.QuantizedEmbedding)):
        return module.as_linear(x)
    return module(x)


def apply_pair(first: nn.Module, second: nn.Module, x: mx.array) -> tuple:
    """(first(x), second(x)): two linear layers on the same input."""
    return apply_linear(first, x), apply_linear(second, x)


@dataclass(frozen=True)
class Kernels:
    name: str
    swiglu: Callable[[mx.array, mx.array], mx.array]  # silu(gate) * up
    softmax: Callable[[mx.array], mx.array]  # over the last axis, in float32
    # (q, k, v, scale, mask) as for mx.fast.scaled_dot_product_attention; the mask
    # may also be a WindowMask or a RaggedMask
    attention: Callable[..., mx.array]
    # target blocks on cpu/blocks.py, qwen3_5 recurrent mixers on cpu/delta.py
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
    # ((B, L, H, D) x, a `rope_table`) -> rotated (B, H, L, D): the CPU blocks'
    rope: Callable[[mx.array, tuple], mx.array] | None = None
    # (dims, base, scale, offset, length) -> the rotary table `rope` takes
    rope_table: Callable[[int, float, float, int, int], tuple] | None = None
    # (model_type, layers, kernels) -> stand-ins for the target's decoder blocks, or
    # None where the family has none (cpu/blocks.py)
    blocks: Callable[[str, list, "Kernels"], list | None] | None = None
    # (GatedDeltaNet mixer) -> its forward for many tokens (cpu/delta.py)
    delta_forward: Callable[[nn.Module], Callable] | None = None
    # the drafter's shape-stable pieces (its layers around attention) and the
    # acceptance rule run through mx.compile: fewer ops and Python calls per block
    compiled: bool = False

    def gated(self, gate: nn.Module, up: nn.Module, x: mx.array) -> mx.array:
        """silu(gate(x)) * up(x): a SwiGLU MLP's first half."""
        if self.fused_gate is not None:
            return self.fused_gate(gate, up, x)
        return self.swiglu(*self.linear_pair(gate, up, x))


def _mlx_attention(q, k, v, scale, mask=None):
    if isinstance(mask, (WindowMask, RaggedMask)):
        mask = mask.array(q.shape[2], k.shape[2])
    return mx.fast.scaled_dot_product_attention(q, k, v, scale=scale, mask=mask)


MLX = Kernels(
    name="mlx",
    swiglu=lambda gate, up: nn.silu(gate) * up,
    softmax=lambda x: mx.softmax(x.astype(mx.float32), axis=-1),
    attention=_mlx_attention,
    cpu_blocks=False,
    compiled=True,
)


def shared_rope(layers) -> tuple | None:
    """(dims, base, scale) when every layer rotates its whole heads with the same plain
    `nn.RoPE`, so one rotary table per forward serves them all; else None."""
    params = set()
    for layer in layers:
        attn = layer.self_attn
        rope, head_dim = attn.rope, attn.q_proj.weight.shape[0] // attn.n_heads
        if not isinstance(rope, nn.RoPE) or rope.traditional or rope.dims != head_dim:
            return None
        params.add((rope.dims, rope.base, rope.scale))
    return params.pop() if len(params) == 1 else None


class ForwardTables:
    """The rotary table of the forward in progress, built once for all layers (keyed
    by position offset and length, so any cache may ask) with the kernels'
    `rope_table`."""

    def __init__(
        self, rope: tuple[int, float, float] | None, make_table: Callable | None
    ):
        self.rope = rope
        self.make_table = make_table
        self._key: tuple | None = None
        self._table = None

    def get(self, offset: int, length: int):
        make = self.make_table
        if self.rope is not None and make is not None and (offset, length) != self._key:
            dims, base, scale = self.rope
            self._table = make(dims, base, scale, offset, length)
            self._key = (offset, length)
        return self._table
