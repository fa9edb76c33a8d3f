"""cpu_ops: the CPU's fused exp, softmax, SwiGLU and attention equal MLX's own ops."""

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
import tiny

from dflash_mlx import Target, backend, kernels, load
from dflash_mlx.cpu import ops as cpu_ops

pytestmark = pytest.mark.skipif(
    not cpu_ops.available(), reason="MLX cannot compile CPU kernels here"
)
CPU = backend.for_device(mx.cpu)


# eager, and fused as the kernels run it: a compiler that folded the rounding trick's
# (y + c) - c into y would leave |r| up to 1 and fail the accuracy test
EXPS = {"eager": cpu_ops._exp, "compiled": mx.compile(cpu_ops._exp)}


@pytest.mark.parametrize("mode", EXPS)
def test_exp_is_accurate_over_the_float32_range(mode):
    x = mx.concatenate([mx.linspace(-87, 88, 20001), mx.random.normal((5000,)) * 10])
    exact = np.exp(np.array(x, dtype=np.float64))
    rel = np.abs(np.array(EXPS[mode](x), dtype=np.float64) - exact) / exact
    assert rel.max() < 3e-7  # a few float32 ulps (MLX's own CPU exp is within 4e-6)


@pytest.mark.parametrize("mode", EXPS)
def test_exp_limits(mode):
    x = mx.array([-mx.inf, -1e4, -88.0, 89.0, 1e4, mx.inf, 0.0])
    assert EXPS[mode](x).tolist() == [
        0.0,
        0.0,
        0.0,
        float("inf"),
        float("inf"),
        float("inf"),
        1.0,
    ]


def test_swiglu_and_softmax_match_mlx():
    gate, up = mx.random.normal((2, 8, 96)) * 6, mx.random.normal((2, 8, 96))
    assert mx.allclose(
        cpu_ops.swiglu(gate, up), nn.silu(gate) * up, atol=1e-5, rtol=1e-5
    )
    logits = mx.random.normal((7, 300)) * 8
    assert mx.allclose(cpu_ops.softmax(logits), mx.softmax(logits, axis=-1), atol=1e-6)


def _masks(T, S):
    q = (S - T) + mx.arange(T)[:, None]
    k = mx.arange(S)[None]
    return {"none": None, "causal": k <= q, "window": (k <= q) & (q - k < 5)}


@pytest.mark.parametrize("T", [2, 4, 9])
@pytest.mark.parametrize("heads", [(4, 4), (6, 2)])
@pytest.mark.parametrize("kind", ["none", "causal", "window"])
def test_attention_matches_mlx(T, heads, kind):
    (H, Hkv), S, D = heads, 37, 16
    q = mx.random.normal((1, H, T, D))
    k, v = mx.random.normal((1, Hkv, S, D)), mx.random.normal((1, Hkv, S, D))
    mask = _masks(T, S)[kind]
    expected = mx.fast.scaled_dot_product_attention(q, k, v, scale=D**-0.5, mask=mask)
    got = cpu_ops.attention(q, k, v, D**-0.5, mask)
    assert got.shape == expected.shape
    assert mx.allclose(got, expected, atol=1e-5), float(mx.abs(got - expected).max())


@pytest.mark.parametrize("base,scale", [(10000.0, 1.0), (1e6, 0.25)])
@pytest.mark.parametrize("offset", [0, 300, 9000])
def test_rope_table_equals_mlx_rope(base, scale, offset):
    rope = nn.RoPE(32, traditional=False, base=base, scale=scale)
    x = mx.random.normal(
        (1, 5, 3, 32)
    )  # (B, L, H, D): the layout before the head transpose
    expected = rope(x.transpose(0, 2, 1, 3), offset=offset).transpose(0, 2, 1, 3)
    got = cpu_ops.rope(x, cpu_ops.rope_table(32, base, scale, offset, 5))
    assert mx.array_equal(got, expected)


def test_without_a_compiler_everything_is_mlx_own(models_dir, monkeypatch):
    path = models_dir / "llama-cpu-ops"
    if not path.exists():
        tiny.make_target(path, "llama")
    model, _ = load(str(path))
    monkeypatch.setattr(cpu_ops, "available", lambda: False)
    assert backend.for_device(mx.cpu) is kernels.MLX
    target = Target(model)
    assert target.kernels is kernels.MLX
    assert not target.cpu_blocks
    assert Target(model, kernels=CPU).cpu_blocks


def test_long_query_blocks_keep_mlx_kernel():
    """Prefill chunks go to MLX's kernel: ours holds several (T, S) score arrays."""
    T = cpu_ops.MAX_QUERY_ROWS + 1
    q, k = mx.random.normal((1, 2, T, 8)), mx.random.normal((1, 1, T + 3, 8))
    mask = _masks(T, T + 3)["causal"]
    expected = mx.fast.scaled_dot_product_attention(q, k, k, scale=0.5, mask=mask)
    assert mx.array_equal(cpu_ops.attention(q, k, k, 0.5, mask), expected)
