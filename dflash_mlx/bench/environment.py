"""What a benchmark ran on: machine, chip/CPU, MLX device and BLAS, versions, models."""

import mlx.core as mx

from .. import __version__
from ..backend import cpu_name, detect_blas

# the AVX-512 subsets that OpenBLAS's oldest AVX-512 kernels (SkylakeX) need
AVX512_FLAGS = frozenset({"avx512f", "avx512cd", "avx512bw", "avx512dq", "avx512vl"})


def cpu_flags(cpuinfo: str = "/proc/cpuinfo") -> frozenset[str]:
    """The CPU's feature flags as the kernel reports them (those the OS enabled);
    empty where there is no /proc/cpuinfo."""
    from pathlib import Path

    try:
        text = Path(cpuinfo).read_text()
    except OSError:
        return frozenset()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return frozenset(value.split())
    return frozenset()


def cpu_vectors() -> str | None:
    """The widest x86 vector instructions the CPU has: machines sold under one name
    differ here (AMD EPYC with and without AVX-512), and so do their speeds."""
    flags = cpu_flags()
    if AVX512_FLAGS <= flags:
        return "AVX-512"
    return "AVX2" if "avx2" in flags else None


def describe_weights(model) -> str:
    """'4-bit (group 64)' for quantized models, else the weights' dtype."""
    import mlx.nn as nn
    from mlx.utils import tree_flatten

    quant = [
        m
        for _, m in model.named_modules()
        if hasattr(m, "bits") and hasattr(m, "group_size") and isinstance(m, nn.Module)
    ]
    if quant:
        bits = "/".join(str(b) for b in sorted({m.bits for m in quant}))
        groups = "/".join(str(g) for g in sorted({m.group_size for m in quant}))
        return f"{bits}-bit (group {groups})"
    dtypes = {
        str(v.dtype).replace("mlx.core.", "")
        for v in dict(tree_flatten(model.parameters())).values()
    }
    return "none (" + "/".join(sorted(dtypes)) + ")"


def _chip() -> str | None:
    """The GPU's name where MLX runs on one (best effort)."""
    if mx.default_device().type != mx.gpu:
        return None
    try:
        info = (
            mx.device_info() if hasattr(mx, "device_info") else mx.metal.device_info()
        )
    except Exception:  # a description only: never fail a benchmark over it
        return None
    name = info.get("device_name") or info.get("architecture")
    return str(name) if name else None


def _version(package: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(package)
    except PackageNotFoundError:
        return None


def environment(model=None, draft=None, model_id: str = "", draft_id: str = "") -> dict:
    """Machine, chip/CPU, MLX device and BLAS, versions, models and their weights."""
    import os
    import platform

    env = dict(
        platform=platform.platform(),
        machine=platform.machine(),
        cpu=cpu_name(),
        cpu_count=os.cpu_count(),
        cpu_vectors=cpu_vectors(),
        chip=_chip(),
        device=str(mx.default_device()),
        blas=detect_blas(),
        python=platform.python_version(),
        mlx=_version("mlx"),
        mlx_lm=_version("mlx-lm"),
        dflash_mlx=__version__,
        model=model_id,
        draft=draft_id,
    )
    if _version("dflash"):
        env["dflash_reference"] = _version("dflash")
    if model is not None:
        env["model_type"] = getattr(getattr(model, "args", None), "model_type", None)
        env["model_weights"] = describe_weights(model)
    if draft is not None:
        env["draft_weights"] = describe_weights(draft)
        env["draft_layers"] = draft.args.num_hidden_layers
        env["draft_block_size"] = draft.args.block_size
    return env
