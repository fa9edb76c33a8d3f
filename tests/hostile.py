"""Broken model folders for the hostile-input catalogue (test_hostile_*.py), made from
a tiny pair by damaging one thing each."""

import json
import shutil
from pathlib import Path


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def _edit_config(folder: Path, **changes) -> Path:
    file = folder / "config.json"
    config = json.loads(file.read_text())
    for key, value in changes.items():
        if value is None:
            config.pop(key, None)
        elif isinstance(value, dict):
            config.setdefault(key, {}).update(value)
        else:
            config[key] = value
    file.write_text(json.dumps(config))
    return folder


def broken_folders(root: Path, target: Path, draft: Path) -> dict[str, Path]:
    """{name: folder}: each a copy of `target` or `draft` with one thing wrong."""
    out = {}
    truncated = _copy(target, root / "truncated")
    data = (target / "model.safetensors").read_bytes()
    (truncated / "model.safetensors").write_bytes(data[: len(data) // 2])
    out["truncated"] = truncated
    garbage = _copy(target, root / "garbage")
    (garbage / "model.safetensors").write_bytes(b"\x13\x37" * 4000)
    out["garbage"] = garbage
    out["no_hidden_size"] = _edit_config(
        _copy(target, root / "no-hidden"), hidden_size=None
    )
    no_tok = root / "no-tokenizer"
    no_tok.mkdir()
    for name in ("config.json", "model.safetensors"):
        shutil.copy(target / name, no_tok / name)
    out["no_tokenizer"] = no_tok
    out["draft_block_0"] = _edit_config(
        _copy(draft, root / "draft-b0"), block_size=0, dflash_config={"block_size": 0}
    )
    return out
