"""The suite's float32 tolerance policy (see tests/README.md).

The same math in a different shape (an 8-row verify then a trim, against a `keep`-row
forward) rounds differently, and the BLAS picks other kernels on other CPUs. That
rounding grows with the layers a value has crossed, relative to the value's magnitude,
so a tolerance is a number of float32 ulps of the magnitude per layer crossed. A real
bug (a wrong token kept, a shifted conv window, a stale recurrent state) is off by
orders of magnitude more; tests/test_target.py checks that such bugs fail this bound.
"""

import mlx.core as mx
import numpy as np

EPS32 = float(np.finfo(np.float32).eps)
# Worst seen: 25 ulps/layer (tiny gemma4, AVX-512 + OpenBLAS), <= 3 on the bundled BLAS.
ULPS_PER_LAYER = 128


def tolerance(expected: mx.array, depth: int) -> float:
    """Absolute bound for a float32 result that crossed `depth` layers."""
    scale = float(mx.max(mx.abs(expected.astype(mx.float32))))
    return ULPS_PER_LAYER * EPS32 * max(depth, 1) * max(scale, 1.0)


def error_ratio(actual: mx.array, expected: mx.array, depth: int) -> float:
    """max |actual - expected| in units of the tolerance (<= 1 passes)."""
    if actual.shape != expected.shape:
        return float("inf")
    diff = float(
        mx.max(mx.abs(actual.astype(mx.float32) - expected.astype(mx.float32)))
    )
    return diff / tolerance(expected, depth)


def assert_close(
    actual: mx.array, expected: mx.array, depth: int, what: str = ""
) -> None:
    ratio = error_ratio(actual, expected, depth)
    assert ratio <= 1.0, (
        f"{what}: off by {ratio:.1f}x the {depth}-layer float32 tolerance"
    )


def assert_target_matches_mlx_lm(target, model, blocks, what: str) -> None:
    """`target` (a Target over `model` on some kernels) gives mlx-lm's logits for a
    prompt, then for blocks of these sizes, each against mlx-lm's own forward."""
    from mlx_lm.models.cache import make_prompt_cache

    ours, theirs = target.make_cache(), make_prompt_cache(model)
    prompt = mx.array([[5, 17, 99, 3, 42, 42, 7]])
    target(prompt, ours)
    model(prompt, cache=theirs)
    for block in blocks:
        tokens = (mx.arange(block) * 11 + block)[None] % 250
        hidden, _ = target(tokens, ours)
        depth = target.num_layers + 1
        assert_close(target.logits(hidden), model(tokens, cache=theirs), depth, what)
