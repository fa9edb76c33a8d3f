"""A batch's caches (models/ragged.py): rows of different lengths verified in one
forward give each row exactly what it gets alone, and roll back per row."""

import mlx.core as mx
import pytest
from mlx_lm.models.cache import KVCache
from numerics import assert_close

from dflash_mlx import Target, load
from dflash_mlx.kernels import MLX, RaggedMask
from dflash_mlx.models.cache import WindowedKVCache
from dflash_mlx.models.ragged import BatchCaches, RaggedKVCache

FAMILIES = ["llama", "qwen3", "qwen3_5", "qwen3_moe"]
# on the CPU, these run every product and attention on the native kernels, which
# compute a row alike whatever rows are beside it; the others run some of mlx-lm's
# layers on MLX's own matmuls, whose BLAS rounds differently for other row counts
BIT_EXACT = ("llama", "qwen3")
PROMPTS = [[5, 17, 99, 3, 42, 42, 7, 250, 1, 64], [8, 9], [100, 101, 102, 7, 7]]
BLOCKS = [[11, 12, 13, 14], [21, 22, 23, 24], [31, 32, 33, 34]]


def _solo(target, prompt):
    cache = target.make_cache()
    target(mx.array([prompt]), cache)
    return cache


@pytest.fixture(scope="module", params=["device", "mlx"])
def kernels(request):
    return None if request.param == "device" else MLX


@pytest.mark.parametrize("family", FAMILIES)
def test_a_batched_verify_and_its_rollback_equal_each_row_alone(
    tiny_pair, family, kernels
):
    """Hidden states of every row as alone, after a per-row rollback too (a row
    keeps 0, 2 or all of its block): bit for bit where the kernels are
    row-invariant, else within float32 rounding."""
    t, _ = tiny_pair(family)
    model, _ = load(str(t))
    target = Target(model, (), kernels)
    exact = family in BIT_EXACT and target.cpu_blocks
    keeps = [2, 4, 0]
    batch = BatchCaches(target, None)
    batch.add_rows(len(PROMPTS))
    for row, prompt in enumerate(PROMPTS):
        batch.put(row, type("C", (), {"target": _solo(target, prompt), "draft": None}))
    tape = [] if target.recurrent else None
    hidden, _ = target(mx.array(BLOCKS), batch.target, tape)
    target.rollback_rows(batch.target, tape or [], keeps)
    after, _ = target(mx.array([[60, 61], [62, 63], [64, 65]]), batch.target)
    for row, prompt in enumerate(PROMPTS):
        solo = _solo(target, prompt)
        tape = [] if target.recurrent else None
        alone, _ = target(mx.array([BLOCKS[row]]), solo, tape)
        target.rollback(solo, tape or [], 4, keeps[row])
        next_alone, _ = target(mx.array([[60 + 2 * row, 61 + 2 * row]]), solo)
        if exact:
            assert mx.array_equal(hidden[row], alone[0]), f"row {row} verify"
            assert mx.array_equal(after[row], next_alone[0]), f"row {row} rollback"
        else:
            depth = target.num_layers
            assert_close(hidden[row], alone[0], depth, f"row {row} verify")
            assert_close(after[row], next_alone[0], depth, f"row {row} rollback")


def test_rows_go_in_and_out_unchanged():
    cache = KVCache()
    keys = mx.random.normal((1, 2, 7, 4))
    cache.update_and_fetch(keys, keys + 1)
    window = WindowedKVCache(3)
    window.update_and_fetch(keys, keys + 1)
    window.evict()  # holds positions 4, 5, 6
    ragged = RaggedKVCache(0)
    ragged.add_rows(3)
    ragged.put_row(0, cache)
    ragged.put_row(2, window)
    assert ragged.positions == (7, 0, 7)
    assert ragged.lengths == [7, 0, 3]
    back = ragged.take_row(0)
    assert back.offset == 7 and mx.array_equal(back.keys, keys)
    back = ragged.take_row(2)
    assert back.offset == 7 and mx.array_equal(back.keys, keys[..., 4:, :])
    ragged.keep_rows([2])
    assert ragged.lengths == [3] and mx.array_equal(
        ragged.take_row(0).values, keys[..., 4:, :] + 1
    )


def test_a_lone_row_moves_in_and_out_without_copying_its_history():
    """A batch's only row takes the joining cache's storage as it is, and a leaving
    row from position 0 is handed out as a view of it: no copy of the history on
    either side. Writes after that leave the other's values alone."""
    cache = KVCache()
    keys = mx.random.normal((1, 2, 7, 4))
    cache.update_and_fetch(keys, keys + 1)
    ragged = RaggedKVCache(1)
    ragged.put_row(0, cache)
    assert ragged.keys is cache.keys and ragged.values is cache.values
    assert ragged.lengths == [7] and ragged.bases == [0]
    block = mx.random.normal((1, 2, 2, 4))
    ragged.update_and_fetch(block, block)
    ragged.commit([2])
    back = ragged.take_row(0, share=True)
    assert back.offset == 9 and back.keys.shape[2] >= 9  # with the storage's room
    assert mx.array_equal(back.keys[..., :9, :], mx.concatenate([keys, block], 2))
    back.update_and_fetch(block * 0, block * 0)  # the taken cache writes on...
    ragged.update_and_fetch(block + 5, block + 5)  # ...and so does the batch
    assert mx.array_equal(back.keys[..., 7:9, :], block)
    assert mx.array_equal(back.keys[..., 9:11, :], block * 0)
    assert mx.array_equal(ragged.keys[..., 9:11, :], block + 5)
    assert mx.array_equal(cache.keys[..., :7, :], keys)  # the joined cache too
    copied = ragged.take_row(0)
    assert copied.keys.shape[2] == 9 and copied.keys is not ragged.keys


def test_a_row_sees_only_its_own_keys():
    ragged = RaggedKVCache(2)
    ragged.commit([3, 1])
    mask = ragged.make_mask(2)  # (B, 1, N, width): width = 3 + 2
    assert mask.shape == (2, 1, 2, 5)
    assert mask[0, 0].tolist() == [[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]]
    assert mask[1, 0].tolist() == [[1, 1, 0, 0, 0], [1, 1, 1, 0, 0]]
    same = RaggedMask(ragged.visible(2)).array(2, 5)
    assert mx.array_equal(same[:, 0], mask[:, 0]) or mx.array_equal(same, mask[..., :])


def test_the_native_kernels_compute_each_row_as_alone():
    from dflash_mlx.cpu import native
    from dflash_mlx.cpu.ops import rope_table

    module = native.load()
    if module is None:
        pytest.skip("the native kernels do not build here (no compiler)")
    q = mx.random.normal((3, 4, 4, 16))
    k, v = mx.random.normal((3, 2, 40, 16)), mx.random.normal((3, 2, 40, 16))
    visible = [14, 40, 4]
    out = module.ragged_attention(q, k, v, 0.25, visible)
    x = mx.random.normal((3, 4, 4, 16))
    cos, sin = rope_table(16, 10000.0, 1.0, (10, 36, 0), 4)
    rotated = module.rope(x, cos, sin)
    for b, n in enumerate(visible):
        alone = module.block_attention(
            q[b : b + 1], k[b : b + 1, :, :n], v[b : b + 1, :, :n], 0.25, True
        )
        assert mx.array_equal(out[b : b + 1], alone)
        c, s = rope_table(16, 10000.0, 1.0, (10, 36, 0)[b], 4)
        assert mx.array_equal(rotated[b : b + 1], module.rope(x[b : b + 1], c, s))
    with pytest.raises(ValueError, match="one count per batch row"):
        module.ragged_attention(q, k, v, 0.25, [2, 40, 4])
