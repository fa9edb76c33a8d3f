"""native: the compiled small-product kernel, its build, and where it is used."""

import dataclasses
import shutil
import sys
import sysconfig
import threading
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import pytest
import tiny
from mlx_lm.models.cache import make_prompt_cache
from numerics import assert_close

from dflash_mlx import Target, cpu_ops, kernels, load, native
from dflash_mlx.cpu_gemm import (
    NATIVE_MAX_TOKENS,
    apply_linear,
    native_linear,
    native_pair,
)

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
    else:
        assert native.load() is None and "MLX's matmul" in native.status()


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
def test_a_failed_build_is_remembered_and_explained(tmp_path, monkeypatch):
    """A compiler that fails: MLX's matmul, a reason naming the log, no rebuild."""
    fake = tmp_path / "bin" / "c++"
    fake.parent.mkdir()
    calls = tmp_path / "calls"
    fake.write_text(f"#!/bin/sh\necho call >> {calls}\necho 'boom' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(native, "COMPILERS", (str(fake),))
    monkeypatch.setattr(native, "SOURCE", tmp_path / "small_linear.cpp")
    native.SOURCE.write_text("// a source this test alone builds\n")
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
def test_native_linear_applies_to_dense_float32_layers_only(module):
    x = mx.random.normal((1, 3, 64))
    for layer in (nn.Linear(64, 500), nn.Linear(64, 500, bias=False)):
        assert mx.allclose(native_linear(layer, x), layer(x), atol=1e-4)
    embed = nn.Embedding(700, 64)
    assert mx.allclose(native_linear(embed, x), embed.as_linear(x), atol=1e-4)
    quantized = nn.QuantizedLinear(64, 512, bias=False)
    assert mx.array_equal(native_linear(quantized, x), quantized(x))
    half = nn.Linear(64, 300)
    half.set_dtype(mx.float16)
    x16 = x.astype(mx.float16)
    assert mx.array_equal(native_linear(half, x16), half(x16))
    wide = nn.Linear(64, 300)
    many = mx.random.normal((1, NATIVE_MAX_TOKENS + 1, 64))  # prefill: BLAS wins
    assert mx.array_equal(native_linear(wide, many), apply_linear(wide, many))
    gate, up = native_pair(wide, quantized, x)
    assert mx.array_equal(gate, native_linear(wide, x))
    assert mx.array_equal(up, quantized(x))


@pytest.mark.skipif(not cpu_ops.available(), reason="MLX cannot compile CPU kernels")
@pytest.mark.skipif(not BUILDABLE, reason="needs Linux, a C++ compiler, Python.h")
def test_the_cpu_kernels_use_it():
    chosen = kernels.for_device(mx.cpu)
    assert chosen.linear is native_linear and chosen.linear_pair is native_pair


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
        kernels.for_device(mx.cpu), linear=native_linear, linear_pair=native_pair
    )
    target = Target(model, kernels=chosen)
    assert target.cpu_blocks
    ours, theirs = target.make_cache(), make_prompt_cache(model)
    prompt = mx.array([[5, 17, 99, 3, 42, 42, 7]])
    target(prompt, ours)
    model(prompt, cache=theirs)
    for block in (1, 2, 8, 1, 3, 16):
        tokens = (mx.arange(block) * 11 + block)[None] % 250
        hidden, _ = target(tokens, ours)
        depth = target.num_layers + 1
        assert_close(target.logits(hidden), model(tokens, cache=theirs), depth, family)
