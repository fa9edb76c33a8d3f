"""Everything that exists because MLX's CPU backend is slow: fused ops (`ops`), the
native kernels (`native`), OpenBLAS's small-matrix products (`gemm`), which BLAS is
loaded (`blas`), standard target blocks (`blocks`) and qwen3_5's recurrence in closed
form (`delta`) on those kernels.

Never imported on a Mac: only `backend.for_device` on the CPU device, the doctor
command and Linux-only probes reach it. It may import the base modules (`kernels`,
`files`, ...) and mlx, mlx-lm and numpy; nothing else of dflash_mlx. Importing the
package itself is cheap (the CLI's BLAS check runs before anything else).
"""

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..kernels import Kernels


def kernels() -> "Kernels":
    """The CPU's kernels: fused ops where MLX can compile them, then the native
    kernels where they build, else OpenBLAS's small-matrix products where it has them;
    MLX's generic ones where MLX cannot compile."""
    from dataclasses import replace

    from ..kernels import MLX, Kernels
    from . import native, ops
    from .blocks import cpu_blocks
    from .gemm import blocked_linear, blocked_pair, small_kernels

    if not ops.available():
        return MLX
    chosen = Kernels(
        name="cpu_ops",
        swiglu=ops.swiglu,
        softmax=ops.softmax,
        attention=ops.attention,
        cpu_blocks=True,
        rope=ops.rope_heads,
        rope_table=ops.rope_table,
        blocks=cpu_blocks,
        delta_forward=_delta_forward,
    )
    if native.load() is not None:
        from .native import ops as native_ops

        return replace(
            chosen,
            attention=native_ops.attention,
            linear=native_ops.linear,
            fused_gate=native_ops.gated,
            norm=native_ops.norm,
            half_weights=True,
            rope=native_ops.rope,
        )
    if small_kernels():
        return replace(chosen, linear=blocked_linear, linear_pair=blocked_pair)
    return chosen


def _delta_forward(mixer):
    """`delta.forward_for(mixer)`, importing mlx-lm's qwen3_5 only when a target has
    such mixers."""
    from .delta import forward_for

    return forward_for(mixer)
