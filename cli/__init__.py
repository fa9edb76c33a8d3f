"""The `dflash-mlx` command line (Typer); all terminal rendering lives in `ui.py`."""
