"""Library errors turned into clean CLI exits, at the edge only.

A `ValueError` raised while checking options (before any model loads) is a usage error,
exit 2; one raised once the work started (loading, generating, training) exits 1. Both
print the library's fix-it message, never a traceback.
"""

from collections.abc import Iterator
from contextlib import contextmanager

import typer

USAGE, RUNTIME = 2, 1


@contextmanager
def exit_on_error(console, code: int) -> Iterator[None]:
    """Print a ValueError from the block as `error: ...` and exit with `code`."""
    from . import ui

    try:
        yield
    except ValueError as e:
        ui.error(console, str(e))
        raise typer.Exit(code) from None


def usage(console):
    return exit_on_error(console, USAGE)


def runtime(console):
    return exit_on_error(console, RUNTIME)
