"""What is installed beside us: another distribution that writes `dflash_mlx/`.

This project is distributed as `mlx-dflash` and imported as `dflash_mlx`. The PyPI
name `dflash-mlx` belongs to another project that installs a top-level `dflash_mlx`
package too (and older installs of this one used that name): in one environment the
two overwrite each other's files. `shadowing()` finds that case from the installed
metadata alone (nothing is imported); a base module, so `import dflash_mlx` can warn.
"""

from importlib import metadata
from pathlib import Path

DISTRIBUTION = "mlx-dflash"  # this project's name on PyPI
OTHER = "dflash-mlx"  # another project's; also this one's former name
FIX = f"pip uninstall -y {OTHER} {DISTRIBUTION} && pip install {DISTRIBUTION}"


def _versions(name: str, path: list[str] | None) -> list[str]:
    """The installed versions of `name`. Build metadata left in a source checkout
    (`*.egg-info` beside a pyproject.toml, on sys.path when run from there) is not
    an install."""
    if path is None:  # sys.path
        found = metadata.distributions(name=name)
    else:
        found = metadata.distributions(name=name, path=path)
    return sorted(
        {
            d.version
            for d in found
            if d.version and not Path(str(d.locate_file("pyproject.toml"))).is_file()
        }
    )


def shadowing(path: list[str] | None = None) -> str | None:
    """Why this environment's `dflash_mlx` files cannot be trusted, with the fix; None
    when no `dflash-mlx` distribution is installed. `path` replaces sys.path for the
    search (tests point it at a folder of fake metadata)."""
    other = _versions(OTHER, path)
    if not other:
        return None
    ours = _versions(DISTRIBUTION, path)
    both = f"{OTHER} {', '.join(other)}"
    both += f" and {DISTRIBUTION} {', '.join(ours)} are" if ours else " is"
    return (
        f"{both} installed in this environment: `{OTHER}` is another project on PyPI "
        f"(or this one under its former name) and writes its own `dflash_mlx` package "
        f"over this one's files. Fix: `{FIX}`, or use a separate virtualenv."
    )
