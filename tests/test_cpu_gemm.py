"""cpu/gemm.py: row-blocked 1-3 token products equal the whole ones, on any CPU."""

import dataclasses

import mlx.core as mx
import mlx.nn as nn
import pytest
import tiny
from numerics import assert_target_matches_mlx_lm

from dflash_mlx import Target, backend, kernels, load
from dflash_mlx.cpu import gemm as cpu_gemm
from dflash_mlx.cpu import native
from dflash_mlx.cpu import ops as cpu_ops
from dflash_mlx.cpu.gemm import (
    MAX_TOKENS,
    PRODUCT_LIMIT,
    SPLIT_BLOCKS,
    VOLUME_LIMIT,
    block_rows,
    blocked_linear,
    blocked_pair,
    has_small_kernels,
)
from dflash_mlx.kernels import apply_linear, apply_pair

SKYLAKE_CONFIG = (
    "OpenBLAS 0.3.21 NO_LAPACKE DYNAMIC_ARCH NO_AFFINITY SkylakeX MAX_THREADS=64"
)


@pytest.mark.parametrize(
    "shape, tokens, rows",
    [
        ((1536, 576), 1, 768),  # the demo target's gate/up: two blocks
        ((49152, 576), 1, 1199),  # its LM head: 41 equal blocks
        ((49152, 576), 2, 600),
        ((576, 1536), 1, None),  # down_proj already fits the small kernel
        ((576, 576), 1, None),
        ((1536, 576), 3, 384),  # a 3-token verify: four blocks
        ((1536, 576), 4, None),  # 4+ tokens: blocks cost more than they save
        ((100, 20_000), 1, 50),  # long rows: the volume limit decides
    ],
)
def test_block_rows_examples(shape, tokens, rows):
    assert block_rows(*shape, tokens) == rows


def test_blocks_fit_the_small_kernels_and_are_balanced():
    for out_rows in (577, 1201, 1536, 3000, 49152, 151_936):
        for in_features in (64, 576, 896, 1536, 4096):
            for tokens in (1, 2, 3):
                rows = block_rows(out_rows, in_features, tokens)
                if rows is None:
                    fits = PRODUCT_LIMIT // tokens >= out_rows and (
                        VOLUME_LIMIT // (tokens * in_features) >= out_rows
                    )
                    assert fits or VOLUME_LIMIT < tokens * in_features
                    continue
                assert rows < out_rows
                assert rows * tokens <= PRODUCT_LIMIT
                assert rows * tokens * in_features <= VOLUME_LIMIT
                blocks = -(-out_rows // rows)
                fits = min(
                    PRODUCT_LIMIT // tokens, VOLUME_LIMIT // (tokens * in_features)
                )
                assert blocks == -(-out_rows // fits)  # as few as the limits allow
                assert out_rows - (blocks - 1) * rows > rows - blocks  # no sliver


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("x_shape", [(1, 1, 96), (1, 2, 96), (2, 1, 96), (96,)])
def test_blocked_linear_equals_the_layer(bias, x_shape):
    layer = nn.Linear(96, 3001, bias=bias)  # 3001 rows: a short last block
    x = mx.random.normal(x_shape)
    assert block_rows(3001, 96, x.size // 96) is not None
    got, want = blocked_linear(layer, x), layer(x)
    assert got.shape == want.shape
    assert mx.allclose(got, want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("tokens", [1, 2])
def test_blocked_linear_on_a_tied_embedding(tokens):
    embed = nn.Embedding(6000, 64)  # 5 or 10 blocks: half of them on the side stream
    x = mx.random.normal((1, tokens, 64))
    assert -(-6000 // block_rows(6000, 64, tokens)) >= SPLIT_BLOCKS
    assert mx.allclose(blocked_linear(embed, x), embed.as_linear(x), atol=1e-5)
    assert mx.array_equal(apply_linear(embed, x), embed.as_linear(x))


@pytest.mark.parametrize("tokens", [1, 2, 3])
def test_blocked_pair_runs_each_product_as_blocked_linear(tokens):
    gate, up = nn.Linear(128, 3001, bias=False), nn.Linear(128, 3001, bias=False)
    x = mx.random.normal((1, tokens, 128))
    first, second = blocked_pair(gate, up, x)  # the second on the side stream
    assert mx.array_equal(first, blocked_linear(gate, x))  # the same bits
    assert mx.array_equal(second, blocked_linear(up, x))
    assert mx.allclose(first, gate(x), atol=1e-5, rtol=1e-5)
    assert mx.allclose(second, up(x), atol=1e-5, rtol=1e-5)
    quantized = nn.QuantizedLinear(128, 3001, bias=False)  # not a BLAS product
    first, second = blocked_pair(gate, quantized, x)
    assert mx.array_equal(first, gate(x)) and mx.array_equal(second, quantized(x))


def test_other_layers_keep_their_own_call():
    class Sharded(nn.Linear):  # as mlx-lm's sharded layers: collectives in __call__
        def __call__(self, x):
            return super().__call__(x) + 1.0

    x = mx.random.normal((1, 1, 64))
    sharded = Sharded(64, 3000, bias=False)
    assert mx.array_equal(blocked_linear(sharded, x), sharded(x))
    quantized = nn.QuantizedLinear(64, 3000, bias=False)
    assert mx.array_equal(blocked_linear(quantized, x), quantized(x))
    half = nn.Linear(64, 3000)
    half.set_dtype(mx.float16)  # not a float32 BLAS product
    x16 = x.astype(mx.float16)
    assert mx.array_equal(blocked_linear(half, x16), half(x16))
    wide = nn.Linear(64, 3000)
    x4 = mx.random.normal((1, MAX_TOKENS + 1, 64))
    assert mx.array_equal(blocked_linear(wide, x4), wide(x4))


@pytest.mark.parametrize(
    "corename, config, expected",
    [
        ("SkylakeX", SKYLAKE_CONFIG, True),
        ("Cooperlake", SKYLAKE_CONFIG, True),
        ("SapphireRapids", "OpenBLAS 0.3.28 DYNAMIC_ARCH", True),
        ("Haswell", SKYLAKE_CONFIG, False),  # AVX2 cores: no small kernels
        ("Zen", "OpenBLAS 0.3.21 DYNAMIC_ARCH Zen", False),
        ("SkylakeX", "OpenBLAS 0.3.15 DYNAMIC_ARCH", False),  # before they existed
        ("SkylakeX", "OpenBLAS x.y DYNAMIC_ARCH", False),
        ("SkylakeX", "MKL 2026", False),
        (None, SKYLAKE_CONFIG, False),
        ("SkylakeX", None, False),
    ],
)
def test_has_small_kernels(corename, config, expected):
    assert has_small_kernels(corename, config) is expected


@pytest.mark.skipif(not cpu_ops.available(), reason="MLX cannot compile CPU kernels")
def test_cpu_kernels_block_products_only_without_native_on_small_kernel_openblas():
    chosen = backend.for_device(mx.cpu)
    if native.load() is not None:  # tests/test_native.py: the native kernels win
        from dflash_mlx.cpu.native import ops

        assert chosen.linear is ops.linear
    else:
        blocked = cpu_gemm.small_kernels()
        assert chosen.linear is (blocked_linear if blocked else apply_linear)
        assert chosen.linear_pair is (blocked_pair if blocked else apply_pair)
    assert kernels.MLX.linear is apply_linear and kernels.MLX.linear_pair is apply_pair


@pytest.mark.skipif(not cpu_ops.available(), reason="MLX cannot compile CPU kernels")
@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_target_with_blocked_products_equals_mlx_lm(models_dir, family):
    """Tied (llama) and separate (qwen2, with q/k/v biases) heads, MLP rows and the
    vocabulary both past one block: decode and verify sizes give mlx-lm's logits."""
    path = models_dir / f"{family}-blocked-gemm"
    if not path.exists():
        tiny.make_target(path, family, vocab_size=6000, intermediate_size=1300)
    model, _ = load(str(path))
    blocked = dataclasses.replace(
        backend.for_device(mx.cpu), linear=blocked_linear, linear_pair=blocked_pair
    )
    target = Target(model, kernels=blocked)
    assert target.cpu_blocks
    assert_target_matches_mlx_lm(target, model, (1, 2, 1, 3, 2), family)


def test_the_side_stream_works_from_any_thread():
    """MLX streams belong to the thread that made them: the server generates on its
    own threads, after the main thread used the side stream."""
    import threading

    gate, up = nn.Linear(128, 3001, bias=False), nn.Linear(128, 3001, bias=False)
    embed = nn.Embedding(6000, 128)
    x = mx.random.normal((1, 1, 128))
    want = [*blocked_pair(gate, up, x), blocked_linear(embed, x)]  # main thread first
    mx.eval(want)
    got, errors = [], []

    def work():
        try:
            out = [*blocked_pair(gate, up, x), blocked_linear(embed, x)]
            mx.eval(out)
            got.extend(out)
        except Exception as e:  # reported below, with the thread's message
            errors.append(e)

    thread = threading.Thread(target=work)
    thread.start()
    thread.join()
    assert not errors, errors
    assert all(mx.array_equal(a, b) for a, b in zip(got, want, strict=True))
