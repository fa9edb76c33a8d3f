"""The `dflash-mlx` command line (Typer); all terminal rendering lives in `ui.py`.

The top layer: may import any of dflash_mlx, lazily (inside the commands, so that
`dflash-mlx --help` stays fast); `dflash_mlx.cpu` only from `doctor` (a diagnostic)
and the Linux-only BLAS check in `main`. A command module never imports another.
"""
