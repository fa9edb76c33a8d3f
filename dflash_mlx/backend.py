"""The one entry point that picks kernels, and what the machine runs them on.

`for_device` answers MLX's generic kernels (`kernels.MLX`) on Metal or CUDA and, on
the CPU device only, the CPU's (`dflash_mlx.cpu`, imported then and only then, so a
Mac never imports it); inside `forced(kernels)` it answers those instead.
`detect_blas` and `blas_in_use` name the BLAS without importing `cpu/` on a Mac
either; `cpu_name` names the CPU or chip.
"""

import sys
from collections.abc import Iterator
from contextlib import contextmanager

import mlx.core as mx

from .kernels import MLX, Kernels

KERNEL_CHOICES = ("device", "mlx")  # names for `named`: the device's, or MLX's generic

# The kernels `forced` imposes, innermost last: empty outside a `forced` block.
_forced: list[Kernels] = []


def for_device(device: mx.Device | None = None) -> Kernels:
    """The kernels for `device`; without one, those of the innermost `forced` block,
    else MLX's default device's."""
    if device is None and _forced:
        return _forced[-1]
    device = device or mx.default_device()
    if device == mx.cpu:
        from . import cpu

        return cpu.kernels()
    return MLX


@contextmanager
def forced(kernels: Kernels) -> Iterator[Kernels]:
    """Within the block, every target and drafter built anywhere in the process (any
    thread) runs on `kernels`, e.g. `forced(kernels.MLX)`: the CPU then runs the
    generic kernels that Metal and CUDA run. For the edges only: the suite's
    `--kernels=mlx` run and the CLI's hidden `--kernels mlx`; models built before the
    block keep their kernels."""
    _forced.append(kernels)
    try:
        yield kernels
    finally:
        _forced.pop()


def named(name: str) -> Kernels | None:
    """The kernels a `--kernels` value names: None for "device" (for_device's
    choice), MLX's generic ones for "mlx"."""
    if name not in KERNEL_CHOICES:
        raise ValueError(
            f"--kernels must be one of {', '.join(KERNEL_CHOICES)}, got '{name}'."
        )
    return MLX if name == "mlx" else None


def blas_in_use() -> dict:
    """{'name', 'path', 'fast'}: the BLAS that MLX's CPU matmuls use in this process
    (see cpu/blas.py)."""
    if sys.platform == "darwin":
        return {"name": "Accelerate", "path": None, "fast": True}
    from .cpu.blas import blas_in_use as probe

    return probe()


def detect_blas() -> str:
    """Which BLAS MLX's CPU backend runs on, e.g. 'OpenBLAS SkylakeX (/usr/lib/...)'."""
    if sys.platform == "darwin":
        return "Accelerate/Metal"
    from .cpu.blas import blas_in_use as probe
    from .cpu.blas import openblas_core

    info = probe()
    name = info["name"]
    if name.startswith("reference BLAS"):
        label = "reference BLAS (slow)"
    else:
        label = name if info["fast"] else f"{name} (slow)"
    core = openblas_core()  # its kernels set the speed (OPENBLAS_CORETYPE)
    if core:
        label += f" {core}"
    return f"{label} ({info['path']})" if info["path"] else label


def cpu_name() -> str:
    """The CPU's model name, e.g. 'AMD EPYC 7B13' or 'Apple M3 Max'."""
    import platform
    import subprocess

    if sys.platform.startswith("linux"):
        try:
            with open("/proc/cpuinfo") as f:
                for line in f:
                    if line.startswith("model name"):
                        return line.split(":", 1)[1].strip()
        except OSError:
            pass
    if sys.platform == "darwin":
        try:
            return subprocess.run(
                ["sysctl", "-n", "machdep.cpu.brand_string"],
                capture_output=True,
                text=True,
                timeout=5,
            ).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            pass
    return platform.processor() or platform.machine()
