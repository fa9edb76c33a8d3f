"""Another distribution writing `dflash_mlx/` in the same environment (`dflash-mlx`:
another project's, or this one under its former name): found from fake metadata,
a warning at import, an error from the CLI, a problem in doctor. And the version."""

import json
import os
import subprocess
import sys
from importlib import metadata

import pytest
from typer.testing import CliRunner

import dflash_mlx
from dflash_mlx.cli.main import app
from dflash_mlx.install import FIX, shadowing


def _dist(folder, name: str, version: str, suffix: str = ".dist-info"):
    info = folder / f"{name.replace('-', '_')}-{version}{suffix}"
    info.mkdir(parents=True)
    (info / ("PKG-INFO" if suffix == ".egg-info" else "METADATA")).write_text(
        f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
    )
    return folder


@pytest.fixture
def other(tmp_path):
    """A folder holding only the metadata of bstnxbt's `dflash-mlx` 0.1.8."""
    return _dist(tmp_path / "site", "dflash-mlx", "0.1.8")


def test_found_from_metadata_alone(other, tmp_path):
    assert shadowing([str(tmp_path / "nothing")]) is None
    message = shadowing([str(other)])
    assert "dflash-mlx 0.1.8 is installed" in message and FIX in message
    _dist(other, "mlx-dflash", "0.1.0")
    message = shadowing([str(other)])
    assert "dflash-mlx 0.1.8 and mlx-dflash 0.1.0 are installed" in message
    assert "pip uninstall -y dflash-mlx mlx-dflash && pip install mlx-dflash" in FIX


def test_build_metadata_in_a_checkout_is_no_install(tmp_path):
    """`dflash_mlx.egg-info` left by an old editable install sits beside
    pyproject.toml, on sys.path when run from the checkout."""
    checkout = _dist(tmp_path, "dflash-mlx", "0.1.0", ".egg-info")
    (checkout / "pyproject.toml").write_text("")
    assert shadowing([str(checkout)]) is None


def test_a_warning_at_import(other):
    env = {**os.environ, "PYTHONPATH": str(other)}
    done = subprocess.run(
        [sys.executable, "-c", "import dflash_mlx, dflash_mlx.files"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr.count("UserWarning") == 1 and FIX in done.stderr


def test_the_cli_refuses_and_doctor_reports_it(other, monkeypatch):
    monkeypatch.syspath_prepend(str(other))
    result = CliRunner().invoke(app, ["generate", "-p", "hi", "-n", "1"])
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert "error: dflash-mlx 0.1.8" in result.output and FIX in result.output
    doctor = ["--kernels", "mlx", "doctor", "--matmul-size", "0", "--json"]  # no build
    result = CliRunner().invoke(app, doctor)
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert not report["ok"] and FIX in report["fixes"][0]
    assert "dflash-mlx 0.1.8" in report["shadowed"]


def test_version():
    result = CliRunner().invoke(app, ["--version"])
    assert result.exit_code == 0 and result.output.strip() == dflash_mlx.__version__
    # pyproject.toml reads dflash_mlx.__version__: one place
    assert metadata.version("mlx-dflash") == dflash_mlx.__version__


def test_one_warning_without_a_compiler(monkeypatch, capsys):
    """No C++ compiler on a Linux CPU: the commands that decode say once what to
    install (the native kernels cannot be built; MLX's matmuls are kept)."""
    import mlx.core as mx

    from dflash_mlx.cli import session
    from dflash_mlx.cpu import native

    if not sys.platform.startswith("linux") or mx.default_device() != mx.cpu:
        pytest.skip("the native kernels are built on a Linux CPU only")
    monkeypatch.setattr(native, "COMPILERS", ("no-such-compiler-here",))
    session.warn_without_compiler.cache_clear()
    try:
        session.warn_without_compiler()
        session.warn_without_compiler()
    finally:
        session.warn_without_compiler.cache_clear()
    err = capsys.readouterr().err
    assert err.count("warning: no C++ compiler") == 1 and "apt-get install g++" in err
