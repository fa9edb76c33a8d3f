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


@app.callback()
def _options(
    ctx: typer.Context,
    kernels: str = typer.Option(
        "device",
        "--kernels",
        hidden=True,
        help="'mlx' runs MLX's generic kernels (what a Mac's GPU runs) on any device.",
    ),
):
    """DFlash speculative decoding on MLX: lossless and fast."""
    from dflash_mlx import backend

    from . import errors, ui

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
