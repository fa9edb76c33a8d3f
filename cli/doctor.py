"""`dflash-mlx doctor`: backend, device, BLAS, matmul speed, the models, and fixes."""

import json
import os
import platform
from importlib import metadata

import typer


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "not installed"


def _backend(mx) -> str:
    if mx.metal.is_available():
        return "Metal (GPU)"
    cuda = getattr(mx, "cuda", None)
    if cuda is not None and cuda.is_available():
        return "CUDA (GPU)"
    return "CPU"


def _cpu_kernels(mx) -> tuple[str, list]:
    """Which kernels block verification uses on this device, and a fix if they are
    slow."""
    if mx.default_device() != mx.cpu:
        return "MLX's own (fused on this device)", []
    from dflash_mlx.cpu import ops as cpu_ops

    if cpu_ops.available():
        return "fused (mx.compile, cpu_ops)", []
    return "MLX's own (MLX could not compile CPU kernels)", [
        "MLX could not compile CPU kernels, so verifying a block is ~10% slower: "
        "install a C++ compiler (Debian/Ubuntu: `sudo apt-get install g++`)."
    ]


def _small_products(mx) -> tuple[str, list]:
    """How the products of a decoding step or a verify block run (see
    dflash_mlx/cpu/native and dflash_mlx/cpu/gemm.py), and a fix where they are slow."""
    from dflash_mlx import backend
    from dflash_mlx.cpu import blas, gemm, native

    chosen = backend.for_device()
    if not chosen.cpu_blocks:
        return "whole (MLX's own kernels)", []
    if native.load() is not None:
        return native.status(), []
    fixes = [
        f"Small products use {native.status()}: decoding on the CPU is up to 1.5x "
        "slower than with the native kernels."
    ]
    core = blas.openblas_core()
    if chosen.linear is gemm.blocked_linear:
        return f"row blocks on OpenBLAS's small-matrix kernels ({core})", fixes
    if core:
        return f"whole (OpenBLAS's {core} kernels have no small-matrix path)", fixes
    return "whole (not an OpenBLAS with small-matrix kernels)", fixes


def collect(matmul_size: int = 1024, model: str | None = None, group=None) -> dict:
    """Everything doctor reports, as plain data (also what `--json` prints)."""
    import mlx.core as mx

    from dflash_mlx.cpu import blas
    from dflash_mlx.install import shadowing
    from dflash_mlx.loading import defaults

    info = blas.blas_in_use()
    gflops = blas.matmul_gflops(matmul_size) if matmul_size > 0 else None
    openblas = blas.find_openblas()
    report = {
        "platform": f"{platform.system()} {platform.machine()}",
        "python": platform.python_version(),
        "mlx": _version("mlx"),
        "mlx_lm": _version("mlx-lm"),
        "backend": _backend(mx),
        "device": str(mx.default_device()),
        "blas": info["name"],
        "blas_path": info["path"],
        "openblas_installed": openblas,
        "reexecuted": blas.REEXEC_MARKER in os.environ,
        "matmul_size": matmul_size,
        "matmul_gflops": None if gflops is None else round(gflops, 1),
        "openblas_core": blas.openblas_core(),
        "fixes": blas.advice(info, gflops, openblas=openblas),
    }
    report["shadowed"] = shadowing()  # another package writes dflash_mlx/ here too
    if report["shadowed"]:
        report["fixes"].insert(0, report["shadowed"])
    report["distributed"] = None  # this process's group under mlx.launch
    if group is not None:
        report["distributed"] = {**group.describe(), "rank": group.rank}
    report["cpu_kernels"], fixes = _cpu_kernels(mx)
    report["small_products"], product_fixes = _small_products(mx)
    fixes += product_fixes
    report["fixes"] += fixes
    try:  # never downloads: the built-in target is fetched on first use
        report["default_target"] = defaults.default_target(download=False)
    except ValueError:
        report["default_target"] = None
    report["default_draft"] = defaults.default_draft()
    if report["default_draft"] is None:
        report["fixes"].append(
            f"No built-in drafter for {defaults.TARGET_NAME} ships with this install "
            "yet: train one with `dflash-mlx train`, or pass a drafter with --draft."
        )
    if model is not None:
        from dflash_mlx.loading.check import check_target

        report["model"] = check_target(model)
        if not report["model"]["loads"]:
            report["fixes"].append(f"{model}: {report['model']['reason']}")
    report["ok"] = not report["fixes"]
    return report


def _model_rows(m: dict) -> list[tuple[str, str]]:
    loads = "[green]yes[/green]" if m["loads"] else "[red]no[/red]"
    details = ", ".join(f"{k} {v}" for k, v in m["details"].items() if v is not None)
    rows = [
        ("Model", m["model"]),
        ("Found", f"{m['source'] or 'no'}" + (f": {m['path']}" if m["path"] else "")),
        (
            "Family",
            f"{m['family'] or '?'} "
            f"({'supported' if m['supported'] else 'not supported from this source'})",
        ),
        ("Details", details or "-"),
        ("Will load", loads),
        ("Drafter (registry)", m["drafter"] or "none known: plain decoding"),
    ]
    if m["builtin_drafter"]:
        rows.append(("Built-in drafter", f"{m['builtin_drafter']} (`dflash-mlx chat`)"))
    if m["reason"]:
        rows.append(("Why not", m["reason"]))
    return rows


def _group_text(group: dict | None) -> str:
    if group is None:
        return "one process (start with mlx.launch to shard a target)"
    return (
        f"{group['size']} ranks, {group['backend']} backend (this report: rank "
        f"{group['rank']})"
    )


def _install_text(shadowed: str | None) -> str:
    from dflash_mlx import __version__
    from dflash_mlx.install import DISTRIBUTION, OTHER

    if shadowed:
        return f"[red]{OTHER} is installed too: see the fix below[/red]"
    return f"{DISTRIBUTION} {__version__}"


def _not_downloaded() -> str:
    from dflash_mlx.loading.builtin_target import WHEEL_MB

    return f"[yellow]not downloaded yet[/yellow] ({WHEEL_MB} MB, on first use)"


def render(report: dict):
    from rich.console import Console
    from rich.table import Table

    console = Console()
    table = Table(title="dflash-mlx doctor", show_header=False, title_justify="left")
    table.add_column(style="bold")
    table.add_column(overflow="fold")
    gflops = report["matmul_gflops"]
    speed = "skipped" if gflops is None else f"{gflops:.1f} GFLOP/s"
    core = report["openblas_core"]
    blas = (
        report["blas"]
        + (f", {core} kernels" if core else "")
        + (" (re-executed with LD_PRELOAD)" if report["reexecuted"] else "")
    )
    rows = [
        ("Platform", f"{report['platform']}, Python {report['python']}"),
        ("Install", _install_text(report["shadowed"])),
        ("MLX / mlx-lm", f"{report['mlx']} / {report['mlx_lm']}"),
        ("Backend", report["backend"]),
        ("Device", report["device"]),
        (
            "BLAS in use",
            blas
            + (f"\n[dim]{report['blas_path']}[/dim]" if report["blas_path"] else ""),
        ),
        ("OpenBLAS installed", report["openblas_installed"] or "no"),
        (f"Matmul {report['matmul_size']}² f32", speed),
        ("Attention kernels", report["cpu_kernels"]),
        ("Small products", report["small_products"]),
        ("Distributed", _group_text(report["distributed"])),
        ("Default target", report["default_target"] or _not_downloaded()),
        ("Default drafter", report["default_draft"] or "[yellow]none[/yellow]"),
    ]
    if "model" in report:
        rows += _model_rows(report["model"])
    for name, value in rows:
        table.add_row(name, value)
    console.print(table)
    if report["ok"]:
        console.print("[green]All good.[/green]")
    for fix in report["fixes"]:
        console.print(f"[yellow]fix:[/yellow] {fix}", highlight=False)


def doctor(
    as_json: bool = typer.Option(
        False, "--json", help="Print the report as one JSON object."
    ),
    matmul_size: int = typer.Option(
        1024,
        "--matmul-size",
        help="Size of the matmul speed probe, 256 to 4096 (0 skips it).",
    ),
    model: str | None = typer.Option(
        None,
        "--model",
        "-m",
        help="Also check whether this target (folder, cached Hub id or .gguf) will "
        "load, and which drafter it gets. Reads config/metadata only, never downloads.",
    ),
):
    """Check backend, device, BLAS and matmul speed, the models, and print fixes."""
    from dflash_mlx.cpu.blas import check_matmul_size

    from . import errors, ui
    from .ranks import join

    with errors.usage(ui.console(stderr=True)):
        check_matmul_size(matmul_size)
    report = collect(matmul_size, model, join())
    if as_json:
        typer.echo(json.dumps(report))
    else:
        render(report)
