"""Will a target load? Answered from its config.json or GGUF header alone, offline.

The library half of `dflash-mlx doctor --model M`: a folder, a Hub id already in the
Hugging Face cache (never downloaded here) or a .gguf file; its family, whether `load`
accepts it, the drafter the registry gives it, and why not when it would be refused.
"""

import json
from collections import Counter
from pathlib import Path
from typing import Any

from .registry import drafter_for


def check_target(spec: str) -> dict:
    """A plain-data report on target `spec`; `loads` False comes with a `reason`."""
    report: dict[str, Any] = {
        "model": spec,
        "source": None,
        "path": None,
        "family": None,
        "supported": False,
        "loads": False,
        "reason": None,
        "details": {},
        "drafter": drafter_for(spec),
        "builtin_drafter": None,
    }
    try:
        if spec.endswith(".gguf"):
            _check_gguf(Path(spec).expanduser(), report)
        else:
            _check_folder(_find_folder(spec, report), report)
    except ValueError as e:
        report["reason"] = str(e)
    report["loads"] = report["reason"] is None
    if report["source"] == "gguf" and _is_default_target(report["path"]):
        from .defaults import default_draft

        report["builtin_drafter"] = default_draft()
    return report


def _is_default_target(path: str) -> bool:
    from .defaults import default_target

    try:
        return Path(path).resolve() == Path(default_target(download=False)).resolve()
    except ValueError:
        return False


def _check_gguf(path: Path, report: dict):
    from .. import gguf
    from ..gguf.file import dequantizable, read_header

    report["source"], report["path"] = "gguf", str(path)
    header = read_header(path)
    md = header.metadata
    arch = md.get("general.architecture") or ""
    report["family"] = gguf.ARCHITECTURES.get(arch) or gguf.REFUSED.get(arch, arch)
    kinds = Counter(t.kind for t in header.tensors.values())
    embed = header.tensors.get("token_embd.weight")
    report["details"] = {
        "architecture": arch,
        "layers": md.get(f"{arch}.block_count"),
        "hidden_size": md.get(f"{arch}.embedding_length"),
        "vocab_size": embed.shape[0] if embed else None,
        "tensor_types": dict(kinds.most_common()),
        "file_gb": round(path.stat().st_size / 1e9, 3),
    }
    gguf.check_architecture(md)
    report["supported"] = True
    tokenizer = md.get("tokenizer.ggml.model")
    if tokenizer != "gpt2":
        raise ValueError(
            f"its tokenizer is '{tokenizer}', and only byte-level BPE ('gpt2') is "
            f"rebuilt from GGUF here. {gguf.FIX_ARCH}"
        )
    unreadable = sorted(k for k in kinds if not dequantizable(k))
    if unreadable:
        raise ValueError(
            f"tensor types {unreadable} cannot be dequantized by the `gguf` package; "
            "convert the file with llama.cpp's `llama-quantize`."
        )


def _find_folder(spec: str, report: dict) -> Path:
    path = Path(spec).expanduser()
    if path.is_dir():
        report["source"], report["path"] = "folder", str(path)
        return path
    if path.exists() or spec.startswith((".", "/", "~")) or spec.count("/") != 1:
        raise ValueError(
            f"'{spec}' is neither a folder, a .gguf file nor a Hugging Face repo id "
            "(owner/name)."
        )
    from huggingface_hub import try_to_load_from_cache

    report["source"] = "hub"
    config = try_to_load_from_cache(spec, "config.json")
    if not isinstance(config, str):
        raise ValueError(
            f"'{spec}' is not in the local Hugging Face cache (doctor never "
            "downloads): "
            f"download it with `hf download {spec}`, or pass a local folder."
        )
    report["source"], report["path"] = "hub cache", str(Path(config).parent)
    return Path(config).parent


def _check_folder(path: Path, report: dict):
    from ..models.target import SUPPORTED_MODEL_TYPES

    file = path / "config.json"
    if not file.is_file():
        raise ValueError(f"'{path}' has no config.json: is this the model's folder?")
    try:
        config = json.loads(file.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"'{file}' is not valid JSON ({e}); download it again.") from e
    kind = config.get("model_type")
    text = config.get("text_config") or {}
    family = kind if kind in SUPPORTED_MODEL_TYPES else text.get("model_type", kind)
    quant = config.get("quantization") or {}
    report["family"] = family
    report["details"] = {
        "layers": config.get("num_hidden_layers", text.get("num_hidden_layers")),
        "hidden_size": config.get("hidden_size", text.get("hidden_size")),
        "vocab_size": config.get("vocab_size", text.get("vocab_size")),
        "quantization": quant.get("bits") and f"{quant['bits']}-bit",
    }
    if family not in SUPPORTED_MODEL_TYPES:
        raise ValueError(
            f"it is a '{kind}' model; DFlash targets supported here: "
            f"{', '.join(SUPPORTED_MODEL_TYPES)}."
        )
    report["supported"] = True
    missing = _missing_weights(path)
    if missing:
        raise ValueError(
            f"its weights are incomplete ({', '.join(missing[:3])} missing): download "
            "them again (`hf download <repo>`)."
        )


def _missing_weights(path: Path) -> list[str]:
    index = path / "model.safetensors.index.json"
    if index.is_file():
        shards = set(json.loads(index.read_text()).get("weight_map", {}).values())
        return sorted(s for s in shards if not (path / s).is_file())
    return [] if any(path.glob("*.safetensors")) else ["*.safetensors"]
