"""A quantized KV cache (`kv_bits`): greedy DFlash equals plain decoding with the same
quantized cache, a verify block writes the entries single steps write, and rollback
is exact."""

import mlx.core as mx
import pytest
import tiny
from lossless import oracle
from mlx_lm.generate import generate_step
from mlx_lm.models.cache import QuantizedKVCache
from numerics import assert_close

from dflash_mlx import load, load_draft, make_prompt_cache, stream_generate
from dflash_mlx.engine.loop import as_target

GROUP = 32  # the tiny targets' heads have 32 dimensions here
# gemma4_text: 9 layers, so a full-attention layer (2) is neither sliding nor a KV
# source of the shared layers (those stay float)
OVERRIDES = {
    "qwen3": dict(head_dim=32),
    "qwen3_5": dict(head_dim=32),
    "gemma4_text": dict(head_dim=32, global_head_dim=32, num_hidden_layers=9),
}
PROMPT = "hello world, this is a test"
N = 32


@pytest.fixture(scope="module")
def pairs(models_dir):
    out = {}

    def get(family):
        if family not in out:
            t = models_dir / f"{family}-kv-target"
            if not t.exists():
                tiny.make_target(t, family, **OVERRIDES[family])
            d = tiny.make_draft(models_dir / f"{family}-kv-draft", t)
            model, tok = load(str(t))
            out[family] = (model, tok, load_draft(str(d)))
        return out[family]

    return get


def reference(model, draft, ids, bits):
    """mlx-lm's own greedy decoding on the caches `kv_bits` gives the target."""
    caches = as_target(model, draft).make_cache(bits, GROUP) if bits else None
    steps = generate_step(mx.array(ids), model, prompt_cache=caches, max_tokens=N)
    return [int(y) for y, _ in steps]


def run(model, draft, tok, ids, **kw):
    responses = stream_generate(model, draft, tok, ids, max_tokens=N, **kw)
    return [t for r in responses for t in r.tokens]


@pytest.mark.parametrize("family", list(OVERRIDES))
@pytest.mark.parametrize("bits", [8, 4])
def test_greedy_equals_plain_with_the_same_quantization(pairs, family, bits):
    model, tok, draft = pairs(family)
    ids = tok.encode(PROMPT)
    caches = as_target(model, draft).make_cache(bits, GROUP)
    assert any(isinstance(c, QuantizedKVCache) for c in caches)
    ref = reference(model, draft, ids, bits)
    kv = dict(kv_bits=bits, kv_group_size=GROUP)
    assert run(model, None, tok, ids, **kv) == ref  # this package's plain decoding
    half = oracle(draft, ids + ref, lambda k, i: i % 5 == 0)
    for block_size in (2, 4, 8, "auto"):
        for drafter in (draft, half):
            out = run(model, drafter, tok, ids, block_size=block_size, **kv)
            assert out == ref, (block_size, drafter is half)


def test_the_quantization_changes_the_output(pairs):
    """So the test above compares against the quantized cache, not the float one."""
    model, tok, draft = pairs("qwen3")
    ids = tok.encode(PROMPT)
    assert reference(model, draft, ids, 4) != reference(model, draft, ids, None)


def _quantized(cache) -> list:
    """Per quantized layer: (packed keys, scales, biases, the same for the values,
    bits) up to its offset."""
    out = []
    for c in cache:
        if isinstance(c, QuantizedKVCache):
            arrays = [a[..., : c.offset, :] for a in (*c.keys, *c.values)]
            out.append((arrays, c.bits))
    return out


def assert_same_entries(a: list, b: list, exact: bool):
    """Bit for bit where the target's kernels are batch-invariant (the CPU's for
    qwen3). On MLX's generic kernels a token's keys computed in a block round
    differently in the last bits, and so do their scales and biases (a code may
    flip at a rounding boundary): the entries then agree within one quantization
    step, where a wrong token's would be many steps off."""
    assert len(a) == len(b) > 0
    for (x, bits), (y, _) in zip(a, b, strict=True):
        if exact:
            assert all(mx.array_equal(u, v).item() for u, v in zip(x, y, strict=True))
            continue
        for i in (0, 3):
            dx = mx.dequantize(*x[i : i + 3], group_size=GROUP, bits=bits)
            dy = mx.dequantize(*y[i : i + 3], group_size=GROUP, bits=bits)
            step = mx.abs(x[i + 1]).max().item()
            assert mx.abs(dx - dy).max().item() <= step


def assert_same_hidden(target, a: mx.array, b: mx.array):
    if target.cpu_blocks:
        assert mx.array_equal(a, b).item()
    else:
        assert_close(a, b, target.num_layers + 1, "hidden")


@pytest.mark.parametrize("family", list(OVERRIDES))
def test_a_verify_block_writes_what_single_steps_write(pairs, family):
    """Quantization is per token vector (groups along the head dimension), so a
    block's keys quantize to the entries each token's alone does, as far as the
    float keys agree: bit for bit on the CPU's batch-invariant kernels."""
    model, tok, draft = pairs(family)
    target = as_target(model, draft)
    prompt, block = mx.array([tok.encode(PROMPT)]), mx.arange(11, 17)[None]
    together, alone = target.make_cache(8, GROUP), target.make_cache(8, GROUP)
    target(prompt, together)
    target(prompt, alone)
    hidden, _ = target(block, together)
    steps = [target(block[:, i : i + 1], alone)[0] for i in range(block.shape[1])]
    assert target.cpu_blocks == (family == "qwen3")
    assert_same_entries(_quantized(together), _quantized(alone), target.cpu_blocks)
    assert_same_hidden(target, hidden, mx.concatenate(steps, axis=1))


@pytest.mark.parametrize("family", list(OVERRIDES))
@pytest.mark.parametrize("keep", [0, 3, 8])
def test_rollback_is_exact(pairs, family, keep):
    """A verify of 8 trimmed to `keep` tokens holds what a forward of those holds,
    and continues as it does."""
    model, tok, draft = pairs(family)
    target = as_target(model, draft)
    prompt, block = mx.array([tok.encode(PROMPT)]), mx.arange(20, 28)[None]
    spec, fresh = target.make_cache(4, GROUP), target.make_cache(4, GROUP)
    target(prompt, spec)
    target(prompt, fresh)
    before = _quantized(spec)
    tape: list = []
    target(block, spec, tape)
    target.rollback(spec, tape, block.shape[1], keep)
    if keep:
        target(block[:, :keep], fresh)
    else:  # nothing kept: the entries before the block, bit for bit
        assert_same_entries(before, _quantized(spec), exact=True)
    offsets = [[getattr(c, "offset", None) for c in x] for x in (spec, fresh)]
    assert offsets[0] == offsets[1]
    assert_same_entries(_quantized(spec), _quantized(fresh), target.cpu_blocks)
    nxt = mx.array([[200, 201]])
    assert_same_hidden(target, target(nxt, spec)[0], target(nxt, fresh)[0])
    assert_same_entries(_quantized(spec), _quantized(fresh), target.cpu_blocks)


def test_a_prompt_cache_keeps_its_quantization(pairs):
    model, tok, draft = pairs("qwen3")
    ids = tok.encode(PROMPT)
    cache = make_prompt_cache(model, draft, kv_bits=8, kv_group_size=GROUP)
    assert any(isinstance(c, QuantizedKVCache) for c in cache.target)
    first = run(model, draft, tok, ids, prompt_cache=cache)  # as the cache is
    assert first == reference(model, draft, ids, 8)
    follow = ids + first + tok.encode(" and more")  # the next turn trims and reuses
    again = run(
        model, draft, tok, follow, prompt_cache=cache, kv_bits=8, kv_group_size=GROUP
    )
    assert again == reference(model, draft, follow, 8)
    with pytest.raises(ValueError, match="made with kv_bits=8"):
        run(model, draft, tok, ids, prompt_cache=cache, kv_bits=4, kv_group_size=GROUP)


@pytest.mark.parametrize(
    "bits, group, message",
    [
        (16, 64, "kv_bits must be one of 2, 3, 4, 5, 6, 8"),
        ("8", 64, "kv_bits must be one of"),
        (8, 48, "kv_group_size must be one of 32, 64, 128"),
        (8, 64, "divides its head size"),  # 64 does not divide the heads' 32
    ],
)
def test_bad_kv_options(pairs, bits, group, message):
    model, tok, draft = pairs("qwen3")
    with pytest.raises(ValueError, match=message):
        run(model, draft, tok, [1, 2, 3], kv_bits=bits, kv_group_size=group)
    with pytest.raises(ValueError, match=message):
        make_prompt_cache(model, draft, kv_bits=bits, kv_group_size=group)
