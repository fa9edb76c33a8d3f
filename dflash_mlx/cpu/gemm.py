"""Products of one to three tokens on OpenBLAS's small-matrix kernels.

MLX's CPU backend does every `x @ W.T` with `cblas_sgemm`. For a 1-3 token `x`,
OpenBLAS's general path first copies all of `W` into a packed buffer: on the demo target
(SmolLM2-135M, float32) the copy is ~43% of a plain decoding step (perf, Intel Xeon).
Its AVX-512 builds (SkylakeX and later cores, OpenBLAS 0.3.16+) also have small-matrix
kernels that read `W` where it lies, for products with out_rows x tokens <= 1200 and
out_rows x tokens x in_features <= 10^6. Splitting `W` into row blocks that qualify
turns the 1,536-row MLP projections and the 49,152-row LM head into a few such products
(row slices of a row-major matrix are views, so nothing is copied). Measured on the
demo target: MLP gate + up of 30 layers 20.1 -> 16.7 ms, the LM head 8.9 -> 6.8 ms at
one token; from 4 tokens the blocks cost more than they save, so those stay whole.
Small-matrix kernels run on one core each, so independent products go to a second CPU
stream (`side_stream`): the MLP's up projection beside its gate, half of the LM head's
blocks beside the other half. Plain step 53.6 -> 47.8 ms. The drafter's MLP runs
through the same kernels: drafting a block of 2 costs 5.6 -> 4.4 ms (AMD EPYC Zen 4,
Cooperlake kernels).

`small_kernels()` says whether the OpenBLAS this process calls has those kernels;
`cpu.kernels()` uses `blocked_linear` only then. The results equal the whole
product's to float32 rounding (another summation order), as any two BLAS kernels do.
"""

from functools import cache

import mlx.core as mx
import mlx.nn as nn

from ..kernels import apply_linear, apply_pair
from .blas import AVX512_CORES, openblas_core, openblas_string

PRODUCT_LIMIT = 1200  # out_rows x tokens of OpenBLAS's small "tn" kernel
VOLUME_LIMIT = 1_000_000  # out_rows x tokens x in_features
# measured: at 3 tokens blocks break even on an Intel Xeon and save 11% of a verify on
# an AMD EPYC Zen 4 (Cooperlake kernels); at 4 they lose on the Xeon
MAX_TOKENS = 3
SPLIT_BLOCKS = 4  # products of this many blocks or more split across two streams
# OpenBLAS cores whose kernels include the small-matrix ones: the AVX-512 ones
SMALL_KERNEL_CORES = AVX512_CORES
SMALL_KERNEL_VERSION = (0, 3, 16)


def _dense_weight(module: nn.Module) -> mx.array | None:
    # Exact types only: quantized layers are not BLAS products, and sharded layers'
    # subclasses add collectives around theirs.
    if type(module) in (nn.Linear, nn.Embedding):
        return module.weight
    return None


def block_rows(out_rows: int, in_features: int, tokens: int) -> int | None:
    """Rows per block for a `tokens`-row product with a (out_rows, in_features) weight,
    as equal blocks that each fit the small kernels; None to keep the product whole."""
    if tokens > MAX_TOKENS:
        return None
    fits = min(PRODUCT_LIMIT // tokens, VOLUME_LIMIT // (tokens * in_features))
    if fits >= out_rows or fits < 1:
        return None
    blocks = -(-out_rows // fits)
    return -(-out_rows // blocks)


def _tokens(x: mx.array) -> int:
    return x.size // max(x.shape[-1], 1)


def _small_weight(module: nn.Module, x: mx.array) -> mx.array | None:
    """The weight of a dense float32 layer applied to at most MAX_TOKENS tokens; else
    None."""
    weight = _dense_weight(module)
    if weight is None or weight.dtype != mx.float32 or _tokens(x) > MAX_TOKENS:
        return None
    return weight


def blocked_linear(module: nn.Module, x: mx.array) -> mx.array:
    """`apply_linear(module, x)`, as row blocks of the weight when that pays. A product
    of SPLIT_BLOCKS blocks or more (an LM head) runs half of them on `side_stream()`."""
    weight = _small_weight(module, x)
    if weight is None:
        return apply_linear(module, x)
    out_rows, in_features = weight.shape
    rows = block_rows(out_rows, in_features, _tokens(x))
    if rows is None:
        return apply_linear(module, x)
    starts = range(0, out_rows, rows)
    split = len(starts) // 2 if len(starts) >= SPLIT_BLOCKS else len(starts)
    parts = [x @ weight[i : i + rows].T for i in starts[:split]]
    if split < len(starts):  # the second half beside the first
        with mx.stream(side_stream()):
            parts += [x @ weight[i : i + rows].T for i in starts[split:]]
    y = mx.concatenate(parts, axis=-1)
    bias = getattr(module, "bias", None) if type(module) is nn.Linear else None
    return y if bias is None else y + bias


def blocked_pair(first: nn.Module, second: nn.Module, x: mx.array) -> tuple:
    """`apply_pair`, each product as `blocked_linear`, the second on `side_stream()`
    so both run at once (MLP gate and up)."""
    if _small_weight(first, x) is None or _small_weight(second, x) is None:
        return apply_pair(first, second, x)
    y = blocked_linear(first, x)
    with mx.stream(side_stream()):
        return y, blocked_linear(second, x)


@cache
def side_stream() -> mx.ThreadLocalStream:
    """A second CPU stream, with its own thread, for products that do not depend on
    the main stream's: a small-matrix kernel runs on one core, and one core does not
    use all of the memory bandwidth (MLP gate + up of 30 layers: 15.7 -> 9.0 ms on two
    streams). Made on first use; thread-local, since MLX streams belong to the thread
    that made them (the server generates on its own threads)."""
    return mx.new_thread_local_stream(mx.cpu)


def has_small_kernels(corename: str | None, config: str | None) -> bool:
    """True for an OpenBLAS core and version (`openblas_get_corename`,
    `openblas_get_config`) with the small-matrix kernels."""
    if not corename or not config:
        return False
    if corename.strip().lower() not in SMALL_KERNEL_CORES:
        return False
    words = config.split()
    if len(words) < 2 or words[0] != "OpenBLAS":
        return False
    try:
        version = tuple(int(p) for p in words[1].split(".")[:3])
    except ValueError:
        return False
    return version >= SMALL_KERNEL_VERSION


@cache
def small_kernels() -> bool:
    """True when MLX's matmuls in this process reach an OpenBLAS with small-matrix
    kernels."""
    return has_small_kernels(openblas_core(), openblas_string("openblas_get_config"))
