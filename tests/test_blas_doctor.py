"""BLAS detection, the OpenBLAS re-exec decision, and `dflash-mlx doctor`."""

import importlib
import json
import sys

import pytest
from typer.testing import CliRunner

from dflash_mlx.cli.main import app
from dflash_mlx.cpu import blas

# the module (the package exports its `environment` function under the same name)
environment = importlib.import_module("dflash_mlx.bench.environment")

OPENBLAS = "/usr/lib/x86_64-linux-gnu/openblas-pthread/libopenblas.so.0"
BUNDLED = "/venv/lib/python3.11/site-packages/mlx_cpu.libs/libblas-bd8a282c.so.3.10.0"
NUMPY = "/venv/lib/python3.11/site-packages/numpy.libs/libscipy_openblas64_-32a4b2a6.so"


def test_reexec_decision():
    env = blas.reexec_env({"PATH": "/bin"}, "linux", OPENBLAS, openblas_loaded=False)
    assert env["LD_PRELOAD"] == OPENBLAS and env[blas.REEXEC_MARKER] == "1"
    assert env["PATH"] == "/bin"
    kept = blas.reexec_env({"LD_PRELOAD": "libx.so"}, "linux", OPENBLAS, False)
    assert kept["LD_PRELOAD"] == f"{OPENBLAS}:libx.so"
    assert blas.reexec_env({}, "linux", OPENBLAS, openblas_loaded=True) is None
    assert blas.reexec_env({}, "linux", None, False) is None
    assert blas.reexec_env({}, "darwin", OPENBLAS, False) is None
    assert blas.reexec_env({blas.NO_REEXEC: "1"}, "linux", OPENBLAS, False) is None
    assert blas.reexec_env({blas.NO_REEXEC: "0"}, "linux", OPENBLAS, False) is not None
    assert (
        blas.reexec_env({blas.REEXEC_MARKER: "1"}, "linux", OPENBLAS, False) is None
    )  # no loop


def test_cpu_flags(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nflags\t\t: fpu avx2 avx512f\n\nprocessor\t: 1\n")
    assert environment.cpu_flags(str(info)) == {"fpu", "avx2", "avx512f"}
    assert environment.cpu_flags(str(tmp_path / "missing")) == frozenset()
    if sys.platform.startswith("linux"):
        assert environment.cpu_flags()  # this machine's


def test_openblas_strings():
    assert blas.openblas_string("no_such_function_anywhere") is None
    if blas.blas_in_use()["name"] == "OpenBLAS (preloaded)":  # as `make test` runs
        assert blas.openblas_core()


def test_ensure_fast_blas_execs_only_when_needed(monkeypatch):
    calls = []
    monkeypatch.setattr(blas.os, "execve", lambda *a: calls.append(a))
    monkeypatch.setattr(blas, "find_openblas", lambda: OPENBLAS)
    monkeypatch.setattr(blas, "loaded_libraries", lambda: [BUNDLED])
    monkeypatch.delenv(blas.NO_REEXEC, raising=False)
    monkeypatch.delenv(blas.REEXEC_MARKER, raising=False)
    blas.ensure_fast_blas(["-m", "dflash_mlx.cli.main", "chat"], platform="linux")
    exe, argv, env = calls[0]
    assert exe == sys.executable and argv == [
        sys.executable,
        "-m",
        "dflash_mlx.cli.main",
        "chat",
    ]
    assert env["LD_PRELOAD"].startswith(OPENBLAS)
    monkeypatch.setenv(blas.NO_REEXEC, "1")
    blas.ensure_fast_blas(["x"], platform="linux")
    monkeypatch.delenv(blas.NO_REEXEC)
    blas.ensure_fast_blas(["x"], platform="darwin")
    assert len(calls) == 1


def test_blas_in_use():
    pre = {"LD_PRELOAD": OPENBLAS}
    assert blas.blas_in_use([NUMPY, BUNDLED], "linux", {})["name"].startswith(
        "reference"
    )
    assert not blas.blas_in_use([NUMPY, BUNDLED], "linux", {})["fast"]
    got = blas.blas_in_use([NUMPY, OPENBLAS, BUNDLED], "linux", pre)
    assert (
        got["name"] == "OpenBLAS (preloaded)"
        and got["path"] == OPENBLAS
        and got["fast"]
    )
    assert blas.blas_in_use([], "darwin", {})["name"] == "Accelerate"
    assert blas.blas_in_use(["/lib/libc.so.6"], "linux", {})["name"] == "unknown"
    live = blas.blas_in_use()  # this process: whatever it is, it is named
    assert live["name"] != "unknown" or sys.platform != "linux"


def test_loaded_libraries_and_find(tmp_path):
    libs = blas.loaded_libraries()
    if sys.platform.startswith("linux"):
        assert any("libc" in p or "libpython" in p or "python" in p for p in libs)
    assert blas.loaded_libraries(str(tmp_path / "nope")) == []
    fake = tmp_path / "libopenblas.so.0"
    fake.write_bytes(b"")
    assert blas.find_openblas([str(tmp_path / "missing.so"), str(fake)]) == str(fake)
    assert blas.find_openblas([str(tmp_path / "missing.so")]) is None


def test_matmul_probe():
    gflops = blas.matmul_gflops(256, min_seconds=0.01)
    assert 0.01 < gflops < 1e5


def test_advice():
    slow = {
        "name": "reference BLAS (bundled with mlx-cpu)",
        "path": BUNDLED,
        "fast": False,
    }
    fix = blas.advice(slow, 2.0, "linux", {}, openblas=None)
    assert any("apt-get install -y libopenblas0-pthread" in f for f in fix)
    assert any("2.0 GFLOP/s" in f for f in fix)
    fix = blas.advice(slow, 2.0, "linux", {blas.NO_REEXEC: "1"}, openblas=OPENBLAS)
    assert any(f"LD_PRELOAD={OPENBLAS}" in f for f in fix)
    fast = {"name": "OpenBLAS (preloaded)", "path": OPENBLAS, "fast": True}
    assert blas.advice(fast, 150.0, "linux", {}, openblas=OPENBLAS) == []


def test_doctor_cli():
    result = CliRunner().invoke(app, ["doctor", "--matmul-size", "256"])
    assert result.exit_code == 0, result.output
    for field in [
        "Backend",
        "Device",
        "BLAS in use",
        "Matmul 256",
        "GFLOP/s",
        "MLX / mlx-lm",
        "Attention kernels",
        "Small products",
        "Default target",
        "Default drafter",
    ]:
        assert field in result.output


def test_doctor_json():
    result = CliRunner().invoke(app, ["doctor", "--json", "--matmul-size", "256"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["backend"] in ("CPU", "Metal (GPU)", "CUDA (GPU)")
    assert report["matmul_gflops"] > 0 and report["matmul_size"] == 256
    assert report["mlx"][0].isdigit() and report["blas"]
    assert isinstance(report["fixes"], list) and report["ok"] == (not report["fixes"])
    if (
        report["backend"] == "CPU"
    ):  # fused when MLX can compile here, else a fix says how
        from dflash_mlx.cpu import ops as cpu_ops

        assert report["cpu_kernels"].startswith("fused") == cpu_ops.available()
        assert cpu_ops.available() or any("C++ compiler" in f for f in report["fixes"])
        from dflash_mlx.cpu import gemm as cpu_gemm
        from dflash_mlx.cpu import native

        blocked = report["small_products"].startswith("row blocks")
        built = report["small_products"].startswith("native (")
        assert built == (cpu_ops.available() and native.load() is not None)
        assert blocked == (
            cpu_ops.available() and not built and cpu_gemm.small_kernels()
        )
    if sys.platform.startswith("linux") and not report["blas"].startswith(
        ("OpenBLAS", "MKL")
    ):
        assert any("OpenBLAS" in f for f in report["fixes"])


def test_doctor_skip_probe():
    result = CliRunner().invoke(app, ["doctor", "--json", "--matmul-size", "0"])
    assert json.loads(result.output)["matmul_gflops"] is None


def test_console_entry_checks_blas_first(monkeypatch, capsys):
    from dflash_mlx.cli import main as cli_main

    order = []
    monkeypatch.setattr(blas, "ensure_fast_blas", lambda: order.append("blas"))
    monkeypatch.setattr(sys, "argv", ["dflash-mlx", "version"])
    try:
        cli_main.main()
    except SystemExit as e:
        assert e.code in (0, None)
    assert order == ["blas"] and capsys.readouterr().out.strip()


@pytest.mark.parametrize(
    "flags, expected",
    [
        (environment.AVX512_FLAGS | {"avx2"}, "AVX-512"),
        (frozenset({"avx2", "fma"}), "AVX2"),
        (frozenset(), None),
    ],
)
def test_bench_environment_names_the_vector_instructions(monkeypatch, flags, expected):
    monkeypatch.setattr(environment, "cpu_flags", lambda: flags)
    assert environment.cpu_vectors() == expected
