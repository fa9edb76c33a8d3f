"""`dflash-mlx` entry point: one small module per command."""

import typer

from .bench import bench
from .chat import chat
from .doctor import doctor
from .generate import generate
from .train import train

app = typer.Typer(
    name="dflash-mlx",
    help="DFlash speculative decoding on MLX: lossless and fast.",
    no_args_is_help=True,
    add_completion=False,
)


def _print_version(value: bool):
    if value:
        from dflash_mlx import __version__

        typer.echo(__version__)
        raise typer.Exit()


@app.callback()
def _options(
    ctx: typer.Context,
    _version: bool = typer.Option(
        False,
        "--version",
        callback=_print_version,
        is_eager=True,
        help="Print the installed version and exit.",
    ),
    kernels: str = typer.Option(
        "device",
        "--kernels",
        hidden=True,
        help="'mlx' runs MLX's generic kernels (what a Mac's GPU runs) on any device.",
    ),
):
    """DFlash speculative decoding on MLX: lossless and fast."""
    from dflash_mlx import backend
    from dflash_mlx.install import shadowing

    from . import errors, ui

    # Another package's files may have replaced ours: only doctor (which reports it)
    # and version run then.
    problem = shadowing()
    if problem and ctx.invoked_subcommand not in ("doctor", "version"):
        ui.error(ui.console(stderr=True), problem)
        raise typer.Exit(errors.RUNTIME)
    with errors.usage(ui.console(stderr=True)):
        chosen = backend.named(kernels)
    if chosen is not None:  # for the whole command, then restored
        ctx.with_resource(backend.forced(chosen))


@app.command()
def version():
    """Print the installed version."""
    from dflash_mlx import __version__

    typer.echo(__version__)


app.command("chat")(chat)
app.command("generate")(generate)
app.command("train")(train)
app.command("bench")(bench)
app.command("doctor")(doctor)


from .serve import serve  # noqa: E402

app.command("serve")(serve)

from .launch import launch  # noqa: E402

app.command("launch", context_settings={"allow_extra_args": True})(launch)


def main():
    """Console entry: on Linux, re-exec once with OpenBLAS preloaded (see
    dflash_mlx/cpu/blas.py) and keep freed buffers in the heap (dflash_mlx/heap.py),
    then run."""
    import sys

    if sys.platform.startswith("linux"):  # elsewhere it never re-executes
        from dflash_mlx.cpu.blas import ensure_fast_blas
        from dflash_mlx.heap import keep_freed_memory

        ensure_fast_blas()
        keep_freed_memory()
    app()


if __name__ == "__main__":
    main()
