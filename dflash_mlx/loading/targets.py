"""Loading targets from Hub ids, local folders or GGUF files, with fix-it errors; the
config and safetensors checks that drafters share."""

import json
from pathlib import Path

import mlx.core as mx

from ..models import draft as draft_module
from ..models.target import SUPPORTED_MODEL_TYPES
from . import long_target
from .hub import resolve_path

TARGET_FILES = [
    "*.json",
    "*.safetensors",
    "*.py",
    "tokenizer.model",
    "*.tiktoken",
    "*.txt",
    "*.jinja",
]


def read_config(path: Path, what: str) -> dict:
    """The folder's config.json, or a ValueError saying what is wrong with it."""
    file = path / "config.json"
    if not file.exists():
        raise ValueError(
            f"{what} folder '{path}' has no config.json: is this the right folder?"
        )
    try:
        return json.loads(file.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(
            f"{what} config '{file}' is not valid JSON ({e}); re-download it."
        ) from e


def read_safetensors(path) -> dict[str, mx.array]:
    """`mx.load` of a .safetensors file, checked to be name -> array."""
    weights = mx.load(str(path))
    if not isinstance(weights, dict):
        raise ValueError(f"'{path}' holds no named tensors: is it a .safetensors file?")
    return weights


def check_safetensors(file: Path, what: str):
    """A ValueError naming `file` if its header is not safetensors or its data is cut
    short (an interrupted download), read without loading any tensor."""
    fix = "the file is corrupt or incomplete: delete it and download it again"
    try:
        with open(file, "rb") as f:
            size = int.from_bytes(f.read(8), "little")
            if size <= 0 or size > 100_000_000:
                raise ValueError("no safetensors header")
            raw = f.read(size)
            if len(raw) < size:
                raise ValueError("its header is cut short")
            header = json.loads(raw)
        end = max(
            (v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"),
            default=0,
        )
    except (OSError, ValueError, KeyError, TypeError, IndexError) as e:
        raise ValueError(f"{what} weights '{file}' cannot be read ({e}): {fix}.") from e
    if file.stat().st_size < 8 + size + end:
        raise ValueError(
            f"{what} weights '{file}' are cut short ({file.stat().st_size} bytes of "
            f"{8 + size + end}): {fix}."
        )


def load(path_or_repo: str | None = None, *, distributed=None, **kwargs):
    """Load a target (model, tokenizer): a Hub id, a local folder, a .gguf file,
    "gemma3-270m" (Gemma 3 270M, fetched once), or (with no argument) the built-in
    default target.

    With `distributed` (a `distributed.Group`, e.g. `distributed.launched()`), this
    rank loads its shard of the target (tensor or pipeline parallel, by mlx-lm)."""
    from mlx_lm.utils import load as mlx_lm_load

    if path_or_repo is None:
        from .defaults import default_target

        path_or_repo = default_target()
    elif path_or_repo == long_target.NAME:
        path_or_repo = str(long_target.locate())
    if str(path_or_repo).endswith(".gguf"):
        from ..gguf import load_gguf

        if not Path(path_or_repo).expanduser().is_file():
            raise ValueError(
                f"GGUF file '{path_or_repo}' does not exist; check the path."
            )
        file = Path(path_or_repo).expanduser()
        model, tokenizer = load_gguf(str(file), **kwargs)
        model.name_or_path = str(path_or_repo)
        if distributed is not None:
            _shard(model, distributed, file)
        return model, tokenizer
    path = resolve_path(path_or_repo, TARGET_FILES, "Target model")
    what = f"Target '{path_or_repo}'"
    _check_target_folder(path, read_config(path, "Target model"), what)
    try:
        model, tokenizer = mlx_lm_load(
            str(path), lazy=distributed is not None, **kwargs
        )
    except FileNotFoundError as e:
        raise ValueError(f"{what} is incomplete ({e}); download it again.") from e
    except (TypeError, KeyError) as e:  # mlx-lm's ModelArgs from an incomplete config
        raise ValueError(
            f"{what}: its config.json lacks a field its model needs ({e}); "
            "download config.json again or fix it."
        ) from e
    model.name_or_path = str(path_or_repo)
    if distributed is not None:
        _shard(model, distributed, path)
    return model, tokenizer


TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "tokenizer.model",
    "vocab.json",
)


def _check_target_folder(path: Path, config: dict, what: str):
    """Refuse, before loading, a drafter given as a target, an unsupported family,
    missing tokenizer files or cut-short weights."""
    kind = config.get("model_type")
    archs = config.get("architectures") or []
    if (
        kind == "dflash"
        or "dflash_config" in config
        or any(a in draft_module.ARCHITECTURES for a in archs)
    ):
        raise ValueError(
            f"{what} is a DFlash drafter, not a target model: load it with "
            "load_draft (`--draft` on the command line) and pass the model it was "
            "trained for as the target (`--model`)."
        )
    text_kind = (config.get("text_config") or {}).get("model_type", kind)
    if kind not in SUPPORTED_MODEL_TYPES and text_kind not in SUPPORTED_MODEL_TYPES:
        raise ValueError(
            f"{what} is a '{kind}' model; DFlash targets supported here: "
            f"{', '.join(SUPPORTED_MODEL_TYPES)}."
        )
    if not any((path / f).is_file() for f in TOKENIZER_FILES) and not any(
        path.glob("*.tiktoken")
    ):
        raise ValueError(
            f"{what}: folder '{path}' has no tokenizer files "
            f"({', '.join(TOKENIZER_FILES)}): copy them from the model's original "
            "repo into it."
        )
    for file in sorted(path.glob("*.safetensors")):
        check_safetensors(file, what)


def _shard(model, group, source: Path):
    """Shard a loaded target over `group` once every rank has the same files."""
    from ..distributed import file_digest, shard

    group.check_same("target", file_digest(source))
    shard(model, group)
    mx.eval(model.parameters())
