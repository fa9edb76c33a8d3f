"""native: the compiled small-product kernel, its build, and where it is used."""

import ast
import dataclasses
import fnmatch
import platform
import re
import shutil
import sys
import sysconfig
import threading
import time
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import pytest
import tiny
from numerics import assert_target_matches_mlx_lm

from dflash_mlx import Target, backend, load
from dflash_mlx.cpu import native
from dflash_mlx.cpu import ops as cpu_ops
from dflash_mlx.cpu.native import ops
from dflash_mlx.kernels import MLX, WindowMask, apply_linear
from dflash_mlx.models.draft import block_mask

BUILDABLE = (
    sys.platform == "linux"
    and any(map(shutil.which, native.COMPILERS))
    and (Path(sysconfig.get_paths()["include"]) / "Python.h").is_file()
)


@pytest.fixture(scope="module")
def module():
    built = native.load()
    assert built is not None, native.status()
    return built


def test_builds_where_a_compiler_and_python_headers_are():
    """No silent fallback on the machines the suite runs on: the build must work."""
    if BUILDABLE:
        assert native.load() is not None, native.status()
        assert native.status().startswith("native (")
        # loading marks the build as used, so a later prune keeps it
        build = Path(native.load().__file__).parent
        assert time.time() - build.stat().st_mtime < 3600
    else:
        assert native.load() is None and "MLX's matmul" in native.status()


def test_a_new_build_prunes_only_builds_unused_for_30_days(tmp_path):
    """Old builds (another MLX or source version) go; recent ones, the one in use, one
    mid-build, and anything not named like a build stay."""
    import fcntl
    import os

    now = 1_000_000_000.0
    old, recent = now - native.UNUSED_SECONDS - 60, now - 24 * 3600

    def folder(name, when):
        path = tmp_path / name
        path.mkdir()
        (path / "_dflash_native.so").write_bytes(b"binary")
        os.utime(path, (when, when))
        return path

    current = folder("0123456789abcdef", old)
    stale = folder("fedcba9876543210", old)
    fresh = folder("00000000000000aa", recent)
    building = folder("00000000000000bb", old)
    foreign = folder("my-notes", old)
    lone_file = tmp_path / "00000000000000cc"
    lone_file.write_text("not a build")
    os.utime(lone_file, (old, old))
    with open(building / ".lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        os.utime(building, (old, old))
        removed = native.prune_builds(tmp_path, keep=current, now=now)
    assert removed == [stale]
    assert not stale.exists()
    for kept in (current, fresh, building, foreign, lone_file):
        assert kept.exists(), kept


@pytest.mark.skipif(not BUILDABLE, reason="needs Linux, a C++ compiler, Python.h")
@pytest.mark.parametrize(
    "tokens, rows, inputs",
    [
        (1, 1, 16),
        (1, 37, 40),  # a lane tail, a partial group of rows
        (2, 1536, 576),
        (3, 5, 7),  # shorter than one vector
        (8, 192, 576),
        (9, 77, 130),  # past one pass over x (8 rows)
        (16, 300, 64),
        (17, 33, 48),
    ],
)
def test_small_linear_equals_mlx_matmul(module, tokens, rows, inputs):
    x = mx.random.normal((tokens, inputs))
    w = mx.random.normal((rows, inputs))
    got = module.small_linear(x, w)
    assert got.shape == (tokens, rows) and got.dtype == mx.float32
    assert mx.allclose(got, x @ w.T, atol=1e-4 * inputs**0.5, rtol=1e-5)


@pytest.mark.skipif(not BUILDABLE, reason="needs Linux, a C++ compiler, Python.h")
def test_a_token_gets_the_same_bits_in_any_block(module):
    """Each output is one sum in one order, whatever the rows of x around it: a
    verified token's products equal its decoding step's, bit for bit."""
    x = mx.random.normal((11, 200))
    w = mx.random.normal((301, 200))
    block = module.small_linear(x, w)
    for size in (1, 2, 5, 8, 11):
        part = module.small_linear(x[:size], w)
        assert mx.array_equal(part, block[:size])
    for i in (0, 4, 7, 10):
        assert mx.array_equal(module.small_linear(x[i : i + 1], w)[0], block[i])
    # a batch's verify step: 40 rows, the weight's rows in blocks that stay in L2
    many = mx.random.normal((40, 200))
    wide = mx.random.normal((700, 200))
    batch = module.small_linear(many, wide)
    for i in (0, 9, 39):
        assert mx.array_equal(module.small_linear(many[i : i + 1], wide)[0], batch[i])
    assert mx.array_equal(module.small_linear(many[8:24], wide), batch[8:24])


@pytest.mark.skipif(not BUILDABLE, reason="needs Linux, a C++ compiler, Python.h")
def test_where_x_and_the_weights_lie_changes_no_bit(module):
    """The products copy x to a cache-line boundary and read weights where they lie:
    a lane's share of the sum follows the element's index, never its address."""
    tokens, rows, inputs = 9, 37, 160
    x, w = mx.random.normal((tokens, inputs)), mx.random.normal((rows, inputs))
    want = module.small_linear(x, w)
    pad = mx.random.normal((16 + tokens * inputs,))
    for shift in range(16):  # every float offset within a 64-byte line
        xs = mx.concatenate([pad[:shift], x.reshape(-1), pad[shift:16]])
        ws = mx.concatenate([pad[:shift], w.reshape(-1), pad[shift:16]])
        x_at = xs[shift : shift + x.size].reshape(x.shape)
        w_at = ws[shift : shift + w.size].reshape(w.shape)
        assert mx.array_equal(module.small_linear(x_at, w_at), want), shift
        assert mx.array_equal(
            module.gated_linear(x_at, w_at, w_at), module.gated_linear(x, w, w)
        ), shift


@pytest.mark.skipif(not BUILDABLE, reason="needs Linux, a C++ compiler, Python.h")
def test_takes_lazy_strided_and_batched_inputs(module):
    w = mx.random.normal((64, 96))
    x = mx.random.normal((96, 3)).T  # a transposed view, not yet evaluated
    assert mx.allclose(module.small_linear(x, w), x @ w.T, atol=1e-4)
    x3 = mx.random.normal((1, 4, 96)) * 2.0
    got = module.small_linear(x3, w[::2])  # a strided weight
    assert got.shape == (1, 4, 32)
    assert mx.allclose(got, x3 @ w[::2].T, atol=1e-4)
    with pytest.raises(ValueError, match="float32"):
        module.small_linear(x.astype(mx.float16), w.astype(mx.float16))
    with pytest.raises(ValueError, match="in"):
        module.small_linear(mx.zeros((2, 5)), w)


@pytest.mark.skipif(not BUILDABLE, reason="needs Linux, a C++ compiler, Python.h")
def test_runs_on_other_threads_and_streams(module):
    """The server generates on its own threads and streams; two products at once
    must not share the helper threads' job."""
    w = mx.random.normal((4096, 256))
    xs = [mx.random.normal((2, 256)) for _ in range(4)]
    want = [x @ w.T for x in xs]
    mx.eval(want)
    results, errors = {}, []

    def work(i):
        try:
            stream = mx.new_thread_local_stream(mx.cpu)
            with mx.stream(stream):
                for _ in range(20):
                    out = module.small_linear(xs[i], w)
                    mx.eval(out)
            results[i] = out
        except Exception as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors, errors
    for i in range(4):
        assert mx.allclose(results[i], want[i], atol=1e-3)


@pytest.mark.skipif(not BUILDABLE, reason="needs Linux, a C++ compiler, Python.h")
@pytest.mark.parametrize(
    "tokens, rows, inputs", [(1, 37, 40), (3, 1536, 576), (9, 77, 130)]
)
def test_gated_linear_equals_swiglu(module, tokens, rows, inputs):
    x = mx.random.normal((1, tokens, inputs))
    gate, up = mx.random.normal((rows, inputs)), mx.random.normal((rows, inputs))
    got = module.gated_linear(x, gate, up)
    want = nn.silu(x @ gate.T) * (x @ up.T)
    assert got.shape == want.shape
    assert mx.allclose(got, want, atol=1e-3 * inputs**0.5, rtol=1e-4)
    # the gate is small_linear's product, bit for bit
    g = module.small_linear(x, gate)
    assert mx.array_equal(got, g * module.small_linear(x, up) / (1 + mx.exp(-g))) or (
        mx.allclose(got, nn.silu(g) * module.small_linear(x, up), atol=1e-5, rtol=1e-5)
    )


@pytest.mark.skipif(not BUILDABLE, reason="needs Linux, a C++ compiler, Python.h")
@pytest.mark.parametrize("shape", [(1, 1, 576), (1, 8, 3, 64), (5, 40), (2, 3, 17)])
def test_rms_norm_equals_mlx(module, shape):
    x = mx.random.normal(shape) * 3.0
    w = mx.random.normal(shape[-1:])
    got = module.rms_norm(x, w, 1e-5)
    assert mx.allclose(got, mx.fast.rms_norm(x, w, 1e-5), atol=1e-5, rtol=1e-5)
    rows = x.reshape(-1, shape[-1])  # a row's result does not depend on the others
    assert mx.array_equal(
        module.rms_norm(rows[-1:], w, 1e-5)[0], got.reshape(rows.shape)[-1]
    )


@pytest.mark.skipif(not BUILDABLE, reason="needs Linux, a C++ compiler, Python.h")
@pytest.mark.parametrize(
    "heads, kv_heads, tokens, keys, dim, causal",
    [
        (9, 3, 1, 300, 64, False),  # a decoding step of the demo target
        (9, 3, 8, 308, 64, True),  # a verify block
        (4, 4, 3, 3, 16, True),  # a block that is the whole cache
        (8, 2, 5, 37, 32, True),
        (2, 1, 16, 20, 128, False),
        (2, 2, 3, 10, 48, True),  # 3 or 6 vectors a head: MLX's kernel takes these
        (9, 3, 133, 400, 64, True),  # a prefill chunk over a history: many passes
        (4, 2, 70, 70, 64, True),  # a fresh prompt: early rows see few keys
    ],
)
def test_block_attention_equals_mlx(module, heads, kv_heads, tokens, keys, dim, causal):
    q = mx.random.normal((1, heads, tokens, dim))
    k, v = mx.random.normal((2, 1, kv_heads, keys, dim))
    if not module.attention_fits(dim):  # a power-of-two multiple of the lanes
        with pytest.raises(ValueError, match="power-of-two"):
            module.block_attention(q, k, v, 1.0, causal)
        return
    scale = dim**-0.5
    got = module.block_attention(q, k, v, scale, causal)
    want = mx.fast.scaled_dot_product_attention(
        q, k, v, scale=scale, mask="causal" if causal else None
    )
    assert got.shape == (1, tokens, heads, dim)
    assert mx.allclose(got.transpose(0, 2, 1, 3), want, atol=1e-5, rtol=1e-4)


@pytest.mark.skipif(not BUILDABLE, reason="needs Linux, a C++ compiler, Python.h")
@pytest.mark.parametrize("shape, offset", [((1, 1, 9, 64), 300), ((2, 8, 3, 16), 0)])
def test_rope_equals_mlx_and_writes_heads(module, shape, offset):
    x = mx.random.normal(shape)
    dims = shape[-1]
    table = cpu_ops.rope_table(dims, 10000.0, 1.0, offset, shape[1])
    got = module.rope(x, *table)
    want = mx.fast.rope(
        x.transpose(0, 2, 1, 3),
        dims,
        traditional=False,
        base=10000.0,
        scale=1.0,
        offset=offset,
    )
    assert got.shape == want.shape  # (B, H, L, D): the heads attention reads
    assert mx.allclose(got, want, atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="rope"):
        module.rope(x[..., :-1], *table)


@pytest.mark.skipif(not BUILDABLE, reason="needs Linux, a C++ compiler, Python.h")
def test_block_attention_reads_cache_views_and_each_row_alone(module):
    buffer = mx.random.normal((1, 2, 512, 64))  # a KV cache's buffer, then its view
    k, v = buffer[:, :, :300], (buffer * 2)[:, :, :300]
    q = mx.random.normal((1, 6, 8, 64))
    block = module.block_attention(q, k, v, 0.125, True)
    want = mx.fast.scaled_dot_product_attention(q, k, v, scale=0.125, mask="causal")
    assert mx.allclose(block.transpose(0, 2, 1, 3), want, atol=1e-5, rtol=1e-4)
    for t in (0, 3, 7):  # token t alone, over the keys it sees: the same bits
        alone = module.block_attention(
            q[:, :, t : t + 1], k[:, :, : 293 + t], v[:, :, : 293 + t], 0.125, False
        )
        assert mx.array_equal(alone[:, 0], block[:, t])


@pytest.mark.skipif(not BUILDABLE, reason="needs Linux, a C++ compiler, Python.h")
def test_a_prefill_chunk_row_does_not_depend_on_its_chunk(module):
    """The tiled kernel (chunks of 17 queries and more): a query gets the same bits
    in any such chunk that holds it (a prompt restored from the prefix cache is
    prefilled in other chunks than the same prompt from the start)."""
    buffer = mx.random.normal((1, 2, 512, 64))
    k, v = buffer[:, :, :301], (buffer * 2)[:, :, :301]
    q = mx.random.normal((1, 6, 45, 64))
    whole = module.block_attention(q, k, v, 0.125, True)
    want = mx.fast.scaled_dot_product_attention(q, k, v, scale=0.125, mask="causal")
    assert mx.allclose(whole.transpose(0, 2, 1, 3), want, atol=1e-5, rtol=1e-4)
    tail = module.block_attention(q[:, :, 20:], k, v, 0.125, True)  # 25 queries
    assert mx.array_equal(tail, whole[:, 20:])
    head = module.block_attention(
        q[:, :, :20], k[:, :, :276], v[:, :, :276], 0.125, True
    )
    assert mx.array_equal(head, whole[:, :20])


@pytest.mark.skipif(not BUILDABLE, reason="needs Linux, a C++ compiler, Python.h")
def test_a_failed_build_is_remembered_and_explained(tmp_path, monkeypatch):
    """A compiler that fails: MLX's matmul, a reason naming the log, no rebuild."""
    fake = tmp_path / "bin" / "c++"
    fake.parent.mkdir()
    calls = tmp_path / "calls"
    fake.write_text(f"#!/bin/sh\necho call >> {calls}\necho 'boom' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(native, "COMPILERS", (str(fake),))
    monkeypatch.setattr(native, "FOLDER", tmp_path)
    (tmp_path / "only.cpp").write_text("// a source this test alone builds\n")
    for _ in range(2):
        with pytest.raises(native._Unavailable, match="failed to build") as caught:
            native._load()
    log = next((tmp_path / "cache").rglob("build-failed.txt"))
    assert "boom" in log.read_text() and str(log) in str(caught.value)
    builds = calls.read_text().count("call") - 2  # two `--version` calls
    assert builds == 1


def test_no_compiler_keeps_mlx_matmul(monkeypatch):
    monkeypatch.setattr(native, "COMPILERS", ("no-such-compiler-here",))
    if sys.platform == "linux":
        with pytest.raises(native._Unavailable, match="no C\\+\\+ compiler"):
            native._load()


@pytest.mark.skipif(not BUILDABLE, reason="needs Linux, a C++ compiler, Python.h")
def test_linear_applies_to_dense_float32_layers_only(module):
    x = mx.random.normal((1, 3, 64))
    for layer in (nn.Linear(64, 500), nn.Linear(64, 500, bias=False)):
        assert mx.allclose(ops.linear(layer, x), layer(x), atol=1e-4)
    embed = nn.Embedding(700, 64)
    assert mx.allclose(ops.linear(embed, x), embed.as_linear(x), atol=1e-4)
    quantized = nn.QuantizedLinear(64, 512, bias=False)
    assert mx.array_equal(ops.linear(quantized, x), quantized(x))
    half = nn.Linear(64, 300)
    half.set_dtype(mx.float16)
    x16 = x.astype(mx.float16)
    assert mx.array_equal(ops.linear(half, x16), half(x16))
    wide = nn.Linear(64, 300)
    many = mx.random.normal((1, ops.MAX_TOKENS + 1, 64))  # prefill: BLAS wins
    assert mx.array_equal(ops.linear(wide, many), apply_linear(wide, many))


@pytest.mark.skipif(not cpu_ops.available(), reason="MLX cannot compile CPU kernels")
@pytest.mark.skipif(not BUILDABLE, reason="needs Linux, a C++ compiler, Python.h")
def test_the_cpu_kernels_use_it():
    chosen = backend.for_device(mx.cpu)
    assert chosen.linear is ops.linear and chosen.attention is ops.attention
    assert chosen.fused_gate is ops.gated and chosen.norm is ops.norm
    assert chosen.rope is ops.rope and chosen.half_weights


@pytest.mark.skipif(not cpu_ops.available(), reason="MLX cannot compile CPU kernels")
@pytest.mark.skipif(not BUILDABLE, reason="needs Linux, a C++ compiler, Python.h")
@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3"])
def test_target_on_native_products_equals_mlx_lm(models_dir, family):
    """Tied (llama) and separate heads, q/k/v biases (qwen2), q/k norms (qwen3):
    decode and verify sizes give mlx-lm's logits."""
    path = models_dir / f"{family}-native"
    if not path.exists():
        tiny.make_target(path, family, vocab_size=6000, intermediate_size=1300)
    model, _ = load(str(path))
    chosen = dataclasses.replace(
        backend.for_device(mx.cpu),
        linear=ops.linear,
        attention=ops.attention,
        fused_gate=ops.gated,
        norm=ops.norm,
        rope=ops.rope,
    )
    target = Target(model, kernels=chosen)
    assert target.cpu_blocks
    assert_target_matches_mlx_lm(target, model, (1, 2, 8, 1, 3, 16), family)


@pytest.mark.skipif(not cpu_ops.available(), reason="MLX cannot compile CPU kernels")
@pytest.mark.skipif(not BUILDABLE, reason="needs Linux, a C++ compiler, Python.h")
@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3"])
def test_a_verify_block_equals_plain_steps_bit_for_bit(models_dir, family):
    """Batch-invariant kernels: the logits and drafter features of tokens verified
    in one block are those of decoding them one at a time, exactly (so DFlash's
    greedy output equals plain decoding's whatever the ties)."""
    path = models_dir / f"{family}-native"
    if not path.exists():
        tiny.make_target(path, family, vocab_size=6000, intermediate_size=1300)
    model, _ = load(str(path))
    target = Target(model, (0, 1), backend.for_device(mx.cpu))
    prompt = mx.array([[5, 17, 99, 3, 42, 42, 7]])
    block = mx.array([[11, 250, 3, 3, 98, 7, 1, 64]])
    blocked, stepped = target.make_cache(), target.make_cache()
    target(prompt, blocked)
    target(prompt, stepped)
    hidden, features = target(block, blocked)
    logits = target.logits(hidden)
    for t in range(block.shape[1]):
        h, f = target(block[:, t : t + 1], stepped)
        assert mx.array_equal(target.logits(h)[:, 0], logits[:, t]), t
        assert mx.array_equal(f[:, 0], features[:, t]), t


@pytest.mark.skipif(not BUILDABLE, reason="needs Linux, a C++ compiler, Python.h")
@pytest.mark.parametrize("dtype", [mx.float16, mx.bfloat16])
def test_half_weights_give_the_float32_products_of_their_values(module, dtype):
    """Weights kept in float16/bfloat16 (a shipped drafter's) are read as the float32
    values they hold, at half the bytes: the float32 copy's products, to rounding."""
    x = mx.random.normal((1, 5, 200))
    gate = mx.random.normal((300, 200)).astype(dtype)
    up = mx.random.normal((300, 200)).astype(dtype)
    wide = (gate.astype(mx.float32), up.astype(mx.float32))

    def same(a, b):
        return mx.allclose(a, b, atol=1e-5, rtol=1e-6).item()

    assert same(module.small_linear(x, gate), module.small_linear(x, wide[0]))
    assert same(module.gated_linear(x, gate, up), module.gated_linear(x, *wide))
    strided = gate[::2]  # not row-contiguous: read through a float32 copy
    assert same(module.small_linear(x, strided), module.small_linear(x, wide[0][::2]))
    other = mx.random.normal((300, 200))  # and a wrong weight is far from it
    assert not same(module.small_linear(x, gate), module.small_linear(x, other))
    with pytest.raises(ValueError, match="float32 activations"):
        module.small_linear(x.astype(dtype), gate)


@pytest.mark.skipif(not cpu_ops.available(), reason="MLX cannot compile CPU kernels")
@pytest.mark.skipif(not BUILDABLE, reason="needs Linux, a C++ compiler, Python.h")
def test_a_half_precision_drafter_keeps_its_projections_half(tiny_pair):
    """On the CPU a float16 drafter's projections stay float16 (the native kernels
    read them as stored), its norms and activations float32: it drafts what its
    float32 copy drafts."""
    from dflash_mlx import load_draft
    from dflash_mlx.engine.loop import as_target
    from dflash_mlx.engine.step import draft_block
    from dflash_mlx.models.cache import PromptCache
    from dflash_mlx.models.draft_head import DraftHead
    from dflash_mlx.sampling import SamplingParams

    target_dir, draft_dir = tiny_pair("qwen3")
    model, _ = load(str(target_dir))
    half = load_draft(str(draft_dir))
    assert all(layer.weight.dtype == mx.float32 for layer in half.projections())
    half.set_dtype(mx.float16)  # as a float16 checkpoint loads
    from dflash_mlx.loading.drafters import _drafter_dtype

    _drafter_dtype(half, backend.for_device(mx.cpu))
    wide = load_draft(str(draft_dir))
    wide.update(half.parameters())  # the same values, then widened
    wide.set_dtype(mx.float32)
    assert all(layer.weight.dtype == mx.float16 for layer in half.projections())
    assert half.norm.weight.dtype == mx.float32 and half.dtype == mx.float32
    target = as_target(model, half)
    params = SamplingParams(0.0, 1.0, 0, 0.0)
    block = mx.array([[5] + [half.args.mask_token_id] * (half.args.block_size - 1)])
    outs = []
    for drafter in (half, wide):
        cache = PromptCache(target, drafter)
        hidden, features = target(mx.array([[5, 17, 99, 3, 42]]), cache.target)
        drafter.absorb(features, cache.draft)
        head = DraftHead.for_drafter(target, drafter)
        outs.append(draft_block(target, drafter, head, cache, block, params, None))
    assert mx.array_equal(outs[0][0], outs[1][0])  # proposals
    assert mx.allclose(outs[0][2], outs[1][2], atol=1e-5)  # confidences


@pytest.mark.skipif(not BUILDABLE, reason="needs Linux, a C++ compiler, Python.h")
@pytest.mark.skipif(platform.machine() != "x86_64", reason="x86-64 vector widths")
@pytest.mark.slow
def test_the_avx2_build_passes_its_self_check(tmp_path, monkeypatch):
    """CPUs of one name differ (AVX-512 or AVX2 only): the 8-lane build, which an
    AVX2 machine compiles, must work too; built here for Haswell and checked against
    MLX's ops (this CPU runs Haswell code)."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(native, "ARCH", "-march=haswell")
    avx2 = native._load()
    assert avx2.lanes == 8
    x, w = mx.random.normal((11, 200)), mx.random.normal((301, 200))
    block = avx2.small_linear(x, w)
    assert mx.array_equal(avx2.small_linear(x[4:5], w)[0], block[4])
    assert mx.allclose(block, x @ w.T, atol=1e-3)


@pytest.mark.skipif(not BUILDABLE, reason="needs Linux, a C++ compiler, Python.h")
def test_an_unwritable_cache_keeps_mlx_ops_and_says_why(tmp_path, monkeypatch):
    """Nothing about the build may stop a generation: a cache that cannot be written
    (here a file where the folder should be) falls back, with the reason."""
    blocker = tmp_path / "cache"
    blocker.write_text("not a folder")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocker))
    module, why = native._loaded.__wrapped__()
    assert module is None
    assert why.startswith("MLX's matmul (the native kernels could not be set up")


def test_the_wheel_carries_every_source_the_build_reads():
    """An installed (non-editable) package builds from its package data alone."""
    pyproject = (Path(native.__file__).parents[3] / "pyproject.toml").read_text()
    table = pyproject.split("[tool.setuptools.package-data]", 1)[1]
    found = re.search(r'"dflash_mlx.cpu.native" = (\[.*?\])', table)
    assert found, "pyproject.toml lists no package data for dflash_mlx.cpu.native"
    globs = ast.literal_eval(found.group(1))
    for source in (*native.FOLDER.glob("*.cpp"), *native.FOLDER.glob("*.h")):
        assert any(fnmatch.fnmatch(source.name, g) for g in globs), source.name


@pytest.mark.skipif(not BUILDABLE, reason="needs Linux, a C++ compiler, Python.h")
@pytest.mark.parametrize(
    "tokens, keys, skip", [(2, 300, 45), (8, 263, 7), (4, 9, -2), (40, 300, 100)]
)
@pytest.mark.parametrize("causal", [False, True])
def test_window_attention_equals_mlx_with_the_mask_array(
    module, tokens, keys, skip, causal
):
    """A drafter layer past its sliding window: query t sees keys from skip + t on."""
    q = mx.random.normal((1, 6, tokens, 64))
    k, v = mx.random.normal((2, 1, 2, keys, 64))
    window = WindowMask(skip, causal)
    got = ops.attention(q, k, v, 0.125, window)
    want = mx.fast.scaled_dot_product_attention(
        q, k, v, scale=0.125, mask=window.array(tokens, keys)
    )
    assert mx.allclose(got, want, atol=1e-5, rtol=1e-4)
    assert mx.allclose(cpu_ops.attention(q, k, v, 0.125, window), want, atol=1e-5)
    with pytest.raises(ValueError, match="every query seeing a key"):
        module.block_attention(q, k, v, 0.125, causal, keys)


@pytest.mark.parametrize("causal", [False, True])
def test_block_masks_are_the_window_they_name(causal):
    """block_mask's None / "causal" / WindowMask forms mean what the literal rule
    says: block keys visible (up to the query when causal), context keys while fewer
    than `window` positions back."""
    for block_len, context_len, window in [
        (4, 2, 6),
        (4, 3, 6),
        (8, 300, 256),
        (2, 5, None),
    ]:
        keys = context_len + block_len
        q = context_len + mx.arange(block_len)[:, None]
        k = mx.arange(keys)[None]
        in_block = k >= context_len
        block_ok = in_block & (k <= q) if causal else in_block
        context_ok = ~in_block if window is None else ~in_block & (q - k < window)
        want = mx.broadcast_to(block_ok | context_ok, (block_len, keys))
        mask = block_mask(block_len, context_len, window, causal)
        if mask is None:
            got = mx.ones((block_len, keys), dtype=mx.bool_)
        elif isinstance(mask, str):
            got = mx.arange(keys)[None] <= context_len + mx.arange(block_len)[:, None]
        else:
            got = mask.array(block_len, keys)
        assert mx.array_equal(got, want), (block_len, context_len, window)


@pytest.mark.skipif(not cpu_ops.available(), reason="MLX cannot compile CPU kernels")
@pytest.mark.skipif(not BUILDABLE, reason="needs Linux, a C++ compiler, Python.h")
def test_a_drafter_past_its_window_drafts_as_on_mlx_ops(tiny_pair):
    """Rotary tables and the window's two numbers (no mask array) give the hidden
    states MLX's own rope and masked attention give, with context past the window."""
    from dflash_mlx import load_draft
    from dflash_mlx.engine.loop import as_target
    from dflash_mlx.models.cache import PromptCache

    target_dir, draft_dir = tiny_pair(
        "qwen3", layer_types=("sliding_attention", "full_attention"), sliding_window=6
    )
    model, _ = load(str(target_dir))
    drafter = load_draft(str(draft_dir))
    assert drafter.kernels.rope is not None
    target = as_target(model, drafter)
    block = mx.array([[5] + [drafter.args.mask_token_id] * 7])
    hidden = []
    for chosen in (drafter.kernels, MLX):
        drafter.use_kernels(chosen)
        cache = PromptCache(target, drafter)
        _, features = target(mx.array([list(range(3, 23))]), cache.target)
        drafter.absorb(features, cache.draft)
        hidden.append(drafter(target.embed(block), cache.draft))
    assert mx.allclose(hidden[0], hidden[1], atol=1e-4, rtol=1e-4)
