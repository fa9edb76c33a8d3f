"""cpu_delta's closed-form recurrence equals mlx-lm's token-by-token one, and its mixer
mirrors mlx-lm's qwen3_5 GatedDeltaNet (fails when mlx-lm's changes)."""

import mlx.core as mx
import pytest
import tiny
from mlx_lm.models.cache import ArraysCache, make_prompt_cache
from mlx_lm.models.gated_delta import gated_delta_ops
from numerics import assert_close, error_ratio

from dflash_mlx import Target, backend, load
from dflash_mlx.cpu import delta as cpu_delta
from dflash_mlx.cpu import ops as cpu_ops

pytestmark = pytest.mark.skipif(
    not cpu_ops.available(), reason="MLX cannot compile CPU kernels here"
)
PROMPT = mx.array([[5, 17, 99, 3, 42, 42, 7]])


def _inputs(T, decay, Hk=2, Hv=4, D=16, seed=0):
    mx.random.seed(seed)
    q, k = mx.random.normal((2, 1, T, Hk, D))
    unit = lambda x: x / mx.linalg.norm(x, axis=-1, keepdims=True)  # noqa: E731
    log_g = -decay * mx.random.uniform(shape=(1, T, Hv))
    beta = mx.random.uniform(shape=(1, T, Hv))
    v = mx.random.normal((1, T, Hv, D))
    state = mx.random.normal((1, Hv, D, D))
    return unit(q) * D**-0.5, unit(k), v, log_g, beta, state


@pytest.mark.parametrize("T", [2, 7, 16, 64, 150])
@pytest.mark.parametrize("decay", [1e-3, 1.0, 30.0])  # log g per token, up to this
def test_chunked_recurrence_equals_mlx_lm_steps(T, decay):
    """Outputs and final state, over one chunk and several, weak to total forgetting."""
    q, k, v, log_g, beta, state = _inputs(T, decay)
    y, new = cpu_delta.gated_delta_chunked(q, k, v, log_g, beta, state)
    y_ref, new_ref = gated_delta_ops(q, k, v, mx.exp(log_g), beta, state)
    assert_close(y, y_ref, T, f"outputs, T={T}")
    assert_close(new, new_ref, T, f"state, T={T}")


def test_a_wrong_recurrence_fails_the_tolerance():
    """The bound is tight enough to catch a decay applied one token late."""
    q, k, v, log_g, beta, state = _inputs(16, 1.0)
    shifted = mx.concatenate([mx.zeros_like(log_g[:, :1]), log_g[:, :-1]], axis=1)
    y, _ = cpu_delta.gated_delta_chunked(q, k, v, shifted, beta, state)
    y_ref, _ = gated_delta_ops(q, k, v, mx.exp(log_g), beta, state)
    assert error_ratio(y, y_ref, 16) > 100


def _qwen3_5(models_dir, name="qwen3_5"):
    path = models_dir / f"{name}-cpu-delta"
    if not path.exists():
        tiny.make_target(path, name)
    model, _ = load(str(path))
    return model


@pytest.mark.parametrize("block", [2, 8, 16, 70])
def test_the_target_on_cpu_delta_equals_mlx_lm_forward(models_dir, block):
    """Prompt, then a block (verify sizes, a prefill over two chunks): same logits and
    the same recurrent state, conv window included. (Rollback through it:
    tests/test_target.py, whose targets run on the CPU kernels.)"""
    model = _qwen3_5(models_dir)
    target = Target(model, kernels=backend.for_device(mx.cpu))
    ours, theirs = target.make_cache(), make_prompt_cache(model)
    target(PROMPT, ours)
    model(PROMPT, cache=theirs)
    tokens = (mx.arange(block) * 7 + 3)[None] % 250
    hidden, _ = target(tokens, ours)
    depth = target.num_layers + 1
    assert_close(target.logits(hidden), model(tokens, cache=theirs), depth, "logits")
    recurrent = [
        (a, b) for a, b in zip(ours, theirs, strict=True) if isinstance(a, ArraysCache)
    ]
    assert recurrent
    for mine, ref in recurrent:  # conv window and recurrent state
        assert_close(mine[0], ref[0], depth, "conv state")
        assert_close(mine[1], ref[1], depth, "recurrent state")


def test_other_mixers_keep_mlx_lm_code(models_dir):
    """qwen3_next's mixer is another class: its own code runs, unchanged."""
    model = _qwen3_5(models_dir, "qwen3_next")
    mixer = next(la.linear_attn for la in model.model.layers if la.is_linear)
    assert cpu_delta.forward_for(mixer) is mixer
    qwen = _qwen3_5(models_dir)
    mixer = next(
        la.linear_attn for la in qwen.language_model.model.layers if la.is_linear
    )
    assert cpu_delta.forward_for(mixer) is not mixer
