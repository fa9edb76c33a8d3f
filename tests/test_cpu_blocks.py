"""cpu_blocks mirrors mlx-lm's llama/qwen2/qwen3 block: fails when mlx-lm's changes."""

import mlx.core as mx
import pytest
import tiny
from mlx_lm.models.cache import make_prompt_cache
from numerics import assert_close

from dflash_mlx import Target, backend, load
from dflash_mlx.cpu import ops as cpu_ops
from dflash_mlx.cpu.blocks import FAMILIES

pytestmark = pytest.mark.skipif(
    not cpu_ops.available(), reason="MLX cannot compile CPU kernels here"
)
PROMPT = mx.array([[5, 17, 99, 3, 42, 42, 7]])


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("kv_bits", [None, 8])
@pytest.mark.parametrize("block", [1, 2, 6, 70])
def test_cpu_blocks_equal_mlx_lm_forward(models_dir, family, kv_bits, block):
    """Prompt, then a block (decode, verify sizes, a prefill chunk): same logits."""
    path = models_dir / f"{family}-cpu-blocks"
    if not path.exists():
        # head_dim 32: quantized KV caches need a multiple of the group size
        tiny.make_target(path, family, hidden_size=128, head_dim=32)
    model, _ = load(str(path))
    target = Target(model, kernels=backend.for_device(mx.cpu))
    assert target.cpu_blocks
    ours, theirs = target.make_cache(), make_prompt_cache(model)
    if kv_bits:  # mlx-lm's quantized KV cache: mlx-lm's attention on our q, k, v
        ours = [c.to_quantized(group_size=32, bits=kv_bits) for c in ours]
        theirs = [c.to_quantized(group_size=32, bits=kv_bits) for c in theirs]
    target(PROMPT, ours)
    model(PROMPT, cache=theirs)
    tokens = (mx.arange(block) * 7 + 3)[None] % 250
    hidden, _ = target(tokens, ours)
    depth = target.num_layers + 1
    logits, expected = target.logits(hidden), model(tokens, cache=theirs)
    if kv_bits is None:
        assert_close(logits, expected, depth, family)
        return
    # Our kernels and mlx-lm's BLAS round a key differently in the last bits, and a
    # key at a rounding boundary of the quantization then gets the next code: up to
    # a quantization step apart, not float32 rounding (a wrong block is far more).
    step = float(mx.abs(expected).max()) / (2**kv_bits - 1)
    assert float(mx.abs(logits - expected).max()) <= step, family
