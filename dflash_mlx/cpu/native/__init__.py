"""Native CPU kernels, compiled on first use for this machine and this MLX.

The C++ files here are MLX ops for decoding steps and verify blocks on the CPU:
`small_linear` (`x @ w.T` for a few rows of `x`), `gated_linear` (SwiGLU's first
half), `rms_norm`, `rope` and `block_attention` (a few query rows over a KV cache);
`ops.h` says why. It is built the way MLX builds
its own CPU kernels: with the system C++ compiler, on first use, into the user cache
(`~/.cache/dflash-mlx/native`), keyed by everything the binary depends on (source,
MLX, nanobind, Python, compiler, CPU), so later processes load it at once; a new
build removes the builds no process has loaded for 30 days. It links
the installed `libmlx` and joins MLX's nanobind domain, so it takes and returns
`mx.array`s in lazy graphs like any op. `ops.py` wraps them as the CPU's kernels.

Where it cannot be built (not Linux, no compiler, no Python headers, an MLX whose
nanobind ABI differs) or fails its self-check, `load()` returns None and the caller
keeps MLX's own matmul; `status()` says why (shown by `dflash-mlx doctor`).
"""

import fcntl
import hashlib
import importlib.util
import os
import platform
import re
import shutil
import subprocess
import sys
import sysconfig
import time
from functools import cache
from importlib.metadata import version as version_of
from pathlib import Path
from types import ModuleType
from typing import cast

import mlx.core as mx
import mlx.nn as nn

FOLDER = Path(__file__).parent  # *.cpp and *.h: one module
MODULE = "_dflash_native"
COMPILERS = ("c++", "g++", "clang++")
ARCH = "-march=native"  # this CPU's vector units (the cache key has its flags)
# No fused multiply-adds the compiler picks per loop: it fused `acc += w * x` in some
# template instances and not in others (AVX2 builds, one-row products), so a row's
# result depended on how many rows were computed with it. Every sum is then the same
# operations in the same order in every kernel; the products fuse theirs explicitly
# (simd.h's `fma`, the same in every instance).
EXACT_SUMS = "-ffp-contract=off"
BUILD_SECONDS = 300
# The self-check: odd sizes (a lane tail, a partial group of rows), more rows of x
# than one pass takes, against MLX's own ops.
CHECK_SHAPES = ((1, 37, 40), (3, 41, 64), (11, 9, 130), (5, 33, 64))
CHECK_TOLERANCE = 1e-4
# A build folder's name is a 16-hex-digit key; one no process has loaded for this long
# (another MLX, compiler or source version) is removed when a new build is made.
BUILD_NAME = re.compile(r"[0-9a-f]{16}")
UNUSED_SECONDS = 30 * 24 * 3600


def status() -> str:
    """What `load()` found: the kernels in use, or why MLX's matmul is kept."""
    return _loaded()[1]


def load() -> ModuleType | None:
    """The compiled module (built now if needed), or None where it cannot be."""
    return _loaded()[0]


def compiler() -> str | None:
    """The C++ compiler the build would use, or None where there is none."""
    return next(filter(None, map(shutil.which, COMPILERS)), None)


@cache
def _loaded() -> tuple[ModuleType | None, str]:
    """Built, imported and checked once per process: (module or None, status)."""
    try:
        module = _load()
    except _Unavailable as reason:
        return None, str(reason)
    except (OSError, RuntimeError, ValueError, subprocess.SubprocessError) as e:
        return None, f"MLX's matmul (the native kernels could not be set up: {e})"
    return module, f"native ({module.lanes}-lane vectors, {module.threads()} threads)"


class _Unavailable(Exception):
    """Why the native kernels are not in use here."""


def _load() -> ModuleType:
    if sys.platform != "linux":
        raise _Unavailable("MLX's matmul (native kernels are built on Linux only)")
    cxx = compiler()
    if cxx is None:
        raise _Unavailable("MLX's matmul (no C++ compiler: install g++)")
    python_include = Path(sysconfig.get_paths()["include"])
    if not (python_include / "Python.h").is_file():
        raise _Unavailable(
            "MLX's matmul (no Python headers: install python3-dev or your "
            "Python's development package)"
        )
    try:
        import nanobind
    except ImportError:
        raise _Unavailable(
            "MLX's matmul (nanobind is missing: pip install 'nanobind>=3')"
        ) from None
    folder = _cache_folder(cxx, nanobind.__version__)
    binary = folder / (MODULE + sysconfig.get_config_var("EXT_SUFFIX"))
    failed = folder / "build-failed.txt"
    if not binary.is_file():
        folder.mkdir(parents=True, exist_ok=True)
        with open(folder / ".lock", "w") as lock:  # one build at a time (ranks, tests)
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not binary.is_file() and not failed.is_file():
                _build(cxx, nanobind, python_include, binary, failed)
                prune_builds(folder.parent, keep=folder)
    if failed.is_file():
        raise _Unavailable(
            f"MLX's matmul (the native kernels failed to build; see {failed}, "
            "delete that folder to try again)"
        )
    module = _import(binary)
    _self_check(module)
    _mark_used(folder)
    return module


def _mark_used(folder: Path):
    """Record that a process loaded this build (its folder's time), for pruning."""
    try:
        os.utime(folder)
    except OSError:  # a read-only cache still works; it is just never pruned
        pass


def prune_builds(builds: Path, keep: Path, now: float | None = None) -> list[Path]:
    """Remove the build folders in `builds` (other than `keep`) that no process has
    loaded for UNUSED_SECONDS; the removed folders. Only names of the build key's
    form are touched, and a folder whose build is in progress is left alone."""
    now = time.time() if now is None else now
    removed = []
    for folder in builds.iterdir():
        if folder == keep or not BUILD_NAME.fullmatch(folder.name):
            continue
        try:
            if not folder.is_dir() or now - folder.stat().st_mtime < UNUSED_SECONDS:
                continue
            with open(folder / ".lock", "w") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)  # not mid-build
                shutil.rmtree(folder)
        except OSError:  # in use, or not ours to remove: keep it
            continue
        removed.append(folder)
    return removed


def _cache_folder(compiler: str, nanobind_version: str) -> Path:
    from ...files import user_cache

    version = subprocess.run(
        [compiler, "--version"], capture_output=True, text=True, timeout=30
    ).stdout
    digest = hashlib.sha256()
    sources = sorted([*FOLDER.glob("*.cpp"), *FOLDER.glob("*.h")])
    for part in (
        *(f.name.encode() + f.read_bytes() for f in sources),
        ARCH.encode(),
        EXACT_SUMS.encode(),
        version_of("mlx").encode(),
        nanobind_version.encode(),
        sys.version.encode(),
        version.encode(),
        platform.machine().encode(),
        _cpu_flags().encode(),
    ):
        digest.update(part + b"\0")
    return user_cache() / "native" / digest.hexdigest()[:16]


def _cpu_flags() -> str:
    """The CPU's feature flags (the build targets this CPU's vector units)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return line
    except OSError:
        pass
    return ""


def _build(compiler, nanobind, python_include: Path, binary: Path, failed: Path):
    mlx_dir = Path(mx.__file__).parent
    nb_dir = Path(nanobind.source_dir()).parent
    tmp = binary.with_name(f".{binary.name}.tmp")
    command = [
        compiler,
        *("-O3", ARCH, EXACT_SUMS, "-std=c++20", "-shared", "-fPIC"),
        "-fvisibility=hidden",
        "-DNB_DOMAIN=mlx",  # MLX's nanobind domain: its mx.array type is ours
        f"-I{mlx_dir / 'include'}",
        f"-I{nanobind.include_dir()}",
        f"-I{nb_dir / 'ext' / 'robin_map' / 'include'}",
        f"-I{python_include}",
        *map(str, sorted(FOLDER.glob("*.cpp"))),
        str(Path(nanobind.source_dir()) / "nb_combined.cpp"),
        f"-L{mlx_dir / 'lib'}",
        "-lmlx",
        f"-Wl,-rpath,{mlx_dir / 'lib'}",
        "-o",
        str(tmp),
    ]
    try:
        result = subprocess.run(
            command, capture_output=True, text=True, timeout=BUILD_SECONDS
        )
    except subprocess.TimeoutExpired:
        failed.write_text(f"{' '.join(command)}\ntimed out after {BUILD_SECONDS} s\n")
        return
    if result.returncode != 0:
        failed.write_text(f"{' '.join(command)}\n{result.stderr[-4000:]}")
        tmp.unlink(missing_ok=True)
        return
    tmp.replace(binary)


def _import(binary: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(MODULE, binary)
    if spec is None or spec.loader is None:
        raise _Unavailable(f"MLX's matmul (cannot load {binary})")
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except ImportError as e:
        raise _Unavailable(f"MLX's matmul (loading {binary} failed: {e})") from e
    return module


def _self_check(module: ModuleType):
    """Every op must take MLX's arrays and agree with MLX's own ops."""
    try:
        _check_ops(module)
    except TypeError as e:  # another nanobind ABI than MLX's
        raise _Unavailable(
            f"MLX's matmul (the native kernels cannot take this MLX's arrays: {e})"
        ) from e


def _check_ops(module: ModuleType):
    key = mx.random.key(0)
    with mx.stream(mx.cpu):
        for tokens, rows, inputs in CHECK_SHAPES:
            kx, kg, ku, key = mx.random.split(key, 4)
            x = mx.random.normal((1, tokens, inputs), key=kx)
            gate = mx.random.normal((rows, inputs), key=kg)
            up = mx.random.normal((rows, inputs), key=ku)
            norm = gate[0]
            q, kv = x.reshape(1, 1, tokens, inputs), gate.reshape(1, 1, rows, inputs)
            causal = "causal" if tokens <= rows else None
            checks = {
                "small_linear": (module.small_linear(x, gate), x @ gate.T),
                "gated_linear": (
                    module.gated_linear(x, gate, up),
                    nn.silu(x @ gate.T) * (x @ up.T),
                ),
                "rms_norm": (
                    module.rms_norm(x, norm, 1e-5),
                    mx.fast.rms_norm(x, norm, 1e-5),
                ),
            }
            if module.attention_fits(inputs):
                checks["block_attention"] = (
                    module.block_attention(q, kv, kv, 0.1, causal is not None),
                    mx.fast.scaled_dot_product_attention(
                        q, kv, kv, scale=0.1, mask=causal
                    ).transpose(0, 2, 1, 3),
                )
            for name, (ours, theirs) in checks.items():
                _compare(name, ours, theirs, inputs)


def _compare(name: str, ours: mx.array, theirs: mx.array, inputs: int):
    error = cast(float, mx.abs(ours - theirs).max().item())
    scale = cast(float, mx.abs(theirs).max().item())
    if not error <= CHECK_TOLERANCE * inputs * max(scale, 1.0) ** 0.5:
        raise _Unavailable(
            f"MLX's matmul (native {name} is off by {error:.2e} on {ours.shape})"
        )
