"""Which BLAS MLX's CPU backend runs on, a quick matmul probe, and the switch to
OpenBLAS.

The `mlx[cpu]` wheel for Linux bundles the reference BLAS: a 1024x1024 float32 matmul
runs at a few GFLOP/s, so a 16-token verify forward costs ~14x a 1-token forward and
speculative decoding cannot win. OpenBLAS preloaded with LD_PRELOAD is ~70x faster and
gives identical outputs. `ensure_fast_blas` re-executes the CLI once with it preloaded;
the library itself never does this.

OpenBLAS picks its kernels for the CPU when it loads (OPENBLAS_CORETYPE overrides it).
Which set it runs decides the speed, and whether gemm.py's small-matrix path exists, so
doctor and bench name it (`openblas_core`). It is never changed here: some machines set
OPENBLAS_CORETYPE because older OpenBLAS builds compute wrong results or crash with the
kernels they would pick themselves.
"""

import ctypes
import os
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

NO_REEXEC = "DFLASH_MLX_NO_REEXEC"
REEXEC_MARKER = "DFLASH_MLX_BLAS_REEXEC"
# OpenBLAS cores with AVX-512 kernels (kernel/x86_64/KERNEL.*)
AVX512_CORES = ("skylakex", "cooperlake", "sapphirerapids")
OPENBLAS_PATHS = (
    "/usr/lib/x86_64-linux-gnu/openblas-pthread/libopenblas.so.0",
    "/usr/lib/aarch64-linux-gnu/openblas-pthread/libopenblas.so.0",
    "/usr/lib/x86_64-linux-gnu/libopenblas.so.0",
    "/usr/lib/aarch64-linux-gnu/libopenblas.so.0",
    "/usr/lib64/libopenblas.so.0",
    "/usr/lib/libopenblas.so.0",
)
INSTALL_FIX = "apt-get install -y libopenblas0-pthread"
SLOW_GFLOPS = 20.0
# Below this size a matmul measures call overhead, not the BLAS (OpenBLAS: ~25 GFLOP/s
# at 64-128, ~120 from 256); above the largest, the probe takes minutes and GBs.
MATMUL_SIZES = (256, 4096)


def check_matmul_size(n) -> int:
    """A probe size in MATMUL_SIZES (0: no probe), or a ValueError saying why not."""
    low, high = MATMUL_SIZES
    if isinstance(n, bool) or not isinstance(n, int) or n != 0 and not low <= n <= high:
        raise ValueError(
            f"--matmul-size must be 0 (skip the probe) or between {low} and {high}, "
            f"got {n!r}: smaller matmuls time call overhead, not the BLAS, and "
            "larger ones take minutes on a slow BLAS."
        )
    return n


def _is_openblas(path: str) -> bool:
    # numpy's own copy (libscipy_openblas64_) is not what MLX calls.
    return Path(path).name.startswith("libopenblas")


def loaded_libraries(maps: str = "/proc/self/maps") -> list[str]:
    """Paths of the shared libraries mapped into this process ([] without /proc)."""
    try:
        text = Path(maps).read_text()
    except OSError:
        return []
    seen: dict[str, None] = {}  # an ordered set
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 6 and ".so" in parts[-1]:
            seen.setdefault(parts[-1], None)
    return list(seen)


def find_openblas(candidates: Sequence[str] = OPENBLAS_PATHS) -> str | None:
    """The first installed OpenBLAS library among the usual system locations."""
    return next((p for p in candidates if os.path.exists(p)), None)


def blas_in_use(
    libraries: Sequence[str] | None = None,
    platform: str = sys.platform,
    environ: Mapping[str, str] = os.environ,
) -> dict:
    """{'name', 'path', 'fast'}: the BLAS that MLX's CPU matmuls use in this process."""
    if platform == "darwin":
        return {"name": "Accelerate", "path": None, "fast": True}
    if libraries is None:
        import mlx.core  # noqa: F401  (maps libmlx and the BLAS it links)

        libraries = loaded_libraries()
    preload = environ.get("LD_PRELOAD", "").replace(" ", ":").split(":")
    for lib in libraries:
        if _is_openblas(lib) and any(
            p and Path(p).name == Path(lib).name for p in preload
        ):
            return {"name": "OpenBLAS (preloaded)", "path": lib, "fast": True}
    for lib in libraries:
        name = Path(lib).name
        if "mkl" in name:
            return {"name": "MKL", "path": lib, "fast": True}
        if _is_openblas(lib):
            return {"name": "OpenBLAS", "path": lib, "fast": True}
    for lib in libraries:
        if Path(lib).name.startswith("libblas") and "mlx" in lib:
            return {
                "name": "reference BLAS (bundled with mlx-cpu)",
                "path": lib,
                "fast": False,
            }
    return {"name": "unknown", "path": None, "fast": False}


def matmul_gflops(
    n: int = 1024, min_seconds: float = 0.25, max_repeats: int = 20
) -> float:
    """float32 n x n matmul speed on the default device, in GFLOP/s."""
    import mlx.core as mx

    if not check_matmul_size(n):
        raise ValueError("matmul_gflops needs a size, not 0.")

    a = mx.random.normal((n, n))
    b = mx.random.normal((n, n))
    mx.eval(a, b, a @ b)
    repeats, start = 0, time.perf_counter()
    while True:
        mx.eval(a @ b)
        repeats += 1
        elapsed = time.perf_counter() - start
        if elapsed >= min_seconds or repeats >= max_repeats:
            return 2 * n**3 * repeats / elapsed / 1e9


def openblas_string(name: str) -> str | None:
    """An OpenBLAS string function's answer (`openblas_get_corename`, `..._config`)
    from this process's preloaded OpenBLAS; None where there is no such function."""
    try:
        function = getattr(ctypes.CDLL(None), name)
    except (AttributeError, OSError):
        return None
    function.restype = ctypes.c_char_p
    value = function()
    return value.decode(errors="replace") if value else None


def openblas_core() -> str | None:
    """The core whose kernels this process's preloaded OpenBLAS runs (e.g. SkylakeX,
    Haswell, Zen); None without one (the reference BLAS, Accelerate and MKL have no
    such function)."""
    return openblas_string("openblas_get_corename")


def reexec_env(
    environ: Mapping[str, str],
    platform: str,
    openblas: str | None,
    openblas_loaded: bool,
) -> dict | None:
    """The environment to re-execute with OpenBLAS preloaded, or None to run as is."""
    if not platform.startswith("linux") or openblas is None or openblas_loaded:
        return None
    if environ.get(NO_REEXEC, "") not in ("", "0") or REEXEC_MARKER in environ:
        return None
    env = dict(environ)
    old = env.get("LD_PRELOAD", "")
    env["LD_PRELOAD"] = f"{openblas}:{old}" if old else openblas
    env[REEXEC_MARKER] = "1"
    return env


def ensure_fast_blas(argv: Sequence[str] | None = None, platform: str = sys.platform):
    """At CLI start on Linux: re-exec this command with OpenBLAS preloaded when it
    helps.

    `argv` is the command line after the interpreter (default: this process's own).
    Returns only when no re-exec is needed or possible; set DFLASH_MLX_NO_REEXEC=1 to
    opt out.
    """
    loaded = any(_is_openblas(p) for p in loaded_libraries())
    env = reexec_env(os.environ, platform, find_openblas(), loaded)
    if env is None:
        return
    args = list(sys.orig_argv[1:] if argv is None else argv)
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execve(sys.executable, [sys.executable, *args], env)
    except OSError:
        return  # keep running on the bundled BLAS rather than fail


def advice(
    info: dict,
    gflops: float | None,
    platform: str = sys.platform,
    environ: Mapping[str, str] = os.environ,
    openblas: str | None = None,
) -> list[str]:
    """Fix-it lines for a slow or missing BLAS (empty when all is well)."""
    fixes = []
    if platform.startswith("linux") and not info["fast"]:
        if openblas is None:
            fixes.append(
                f"OpenBLAS is not installed: `{INSTALL_FIX}` (Debian/Ubuntu; as root), "
                "then rerun. dflash-mlx preloads it automatically."
            )
        elif environ.get(NO_REEXEC, "") not in ("", "0"):
            fixes.append(
                f"{NO_REEXEC} is set, so OpenBLAS is not preloaded: unset it, or run "
                f"with LD_PRELOAD={openblas}."
            )
        else:
            fixes.append(
                f"OpenBLAS is installed but not loaded in this process. The dflash-mlx "
                "command preloads it; for your own scripts: "
                f"LD_PRELOAD={openblas} python ..."
            )
    if gflops is not None and gflops < SLOW_GFLOPS and info["name"] != "Accelerate":
        fixes.append(
            f"Matmul runs at {gflops:.1f} GFLOP/s: speculative decoding cannot beat "
            "plain decoding at this speed (OpenBLAS reaches 100+ GFLOP/s on CPU)."
        )
    return fixes
