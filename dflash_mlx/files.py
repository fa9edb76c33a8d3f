"""Writing the user's files safely: checked before a long run, written atomically.

A file is written to a temporary name in its own folder and renamed over the target,
so an interrupted or failed write leaves the old file (or none), never half of one.
`user_cache` is where dflash-mlx keeps what it makes once per machine (unpacked
drafters, native kernel builds, timings).
"""

import os
import secrets
import stat
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """A temporary path next to `path`; renamed to `path` when the block succeeds, else
    deleted. For writers that take a file name (safetensors, matplotlib)."""
    path = Path(path)
    tmp = _new_file(path)
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _new_file(path: Path) -> Path:
    """An empty, new temporary file beside `path`, with the mode the user would get
    for `path`: an existing file's own, else 0o666 less the umask (mkstemp's 0o600
    would make every file we write private)."""
    while True:
        tmp = path.parent / f".{path.stem}.{secrets.token_hex(4)}.tmp{path.suffix}"
        try:
            os.close(os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666))
            break
        except FileExistsError:
            continue
    try:
        os.chmod(tmp, stat.S_IMODE(path.stat().st_mode))
    except FileNotFoundError:
        pass  # a new file: the umask applied
    return tmp


def write_text(path: str | os.PathLike, text: str) -> Path:
    """Write `text` (UTF-8) to `path` atomically."""
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")
    return Path(path)


def write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    """Write `data` to `path` atomically."""
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)
    return Path(path)


def check_writable(path: str | os.PathLike, what: str, overwrite: bool = True) -> Path:
    """`path` as a Path once a file can be created there (its folder is made if
    missing); a ValueError saying why not. With `overwrite` False an existing file is
    refused too."""
    path = Path(path).expanduser()
    if path.is_dir():
        raise ValueError(f"{what} '{path}' is a folder: give a file name.")
    if path.exists() and not overwrite:
        raise ValueError(f"{what} '{path}' already exists.")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path.parent, prefix=".dflash-probe-"):
            pass
    except OSError as e:
        raise ValueError(
            f"{what} '{path}' cannot be written ({e.strerror or e}): choose another "
            "path."
        ) from None
    return path


def check_folder(path: str | os.PathLike, what: str) -> Path:
    """`path` as a Path once it is (or can be made) a writable folder."""
    path = Path(path).expanduser()
    if path.exists() and not path.is_dir():
        raise ValueError(f"{what} '{path}' is a file: give a folder to write into.")
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".dflash-probe-"):
            pass
    except OSError as e:
        raise ValueError(
            f"{what} '{path}' cannot be written ({e.strerror or e}): choose another "
            "folder."
        ) from None
    return path


def user_cache() -> Path:
    """dflash-mlx's folder in the user cache ($XDG_CACHE_HOME, default ~/.cache)."""
    base = os.environ.get("XDG_CACHE_HOME") or "~/.cache"
    return Path(base).expanduser() / "dflash-mlx"
