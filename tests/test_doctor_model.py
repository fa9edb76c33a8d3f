"""`dflash-mlx doctor --model M`: will a target load, its family, drafter, why not."""

import json
import shutil

import gguf_writer
import numpy as np
import pytest
import tiny
from typer.testing import CliRunner

from dflash_mlx.cli.main import app
from dflash_mlx.loading.defaults import default_target


@pytest.fixture(autouse=True)
def no_downloads(monkeypatch):
    import huggingface_hub

    def refuse(*args, **kwargs):
        raise AssertionError("doctor must never download")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", refuse)
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", refuse)


def _doctor(*args) -> str:
    result = CliRunner().invoke(app, ["doctor", "--matmul-size", "0", *args])
    assert result.exit_code == 0, result.output
    return result.output


def _check(model) -> dict:
    report = json.loads(_doctor("--json", "--model", str(model)))
    assert report["ok"] == (not report["fixes"])
    m = report["model"]
    assert m["model"] == str(model)
    if not m["loads"]:
        assert any(m["reason"] in f for f in report["fixes"])
    return m


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    return tiny.make_target(tmp_path_factory.mktemp("doctor") / "llama", "llama")


def test_gguf_that_loads(llama_dir, tmp_path):
    path = tmp_path / "Qwen3-4B-Q8_0.gguf"
    gguf_writer.write_target(llama_dir, path, "Q8_0")
    m = _check(path)
    assert m["loads"] and m["supported"] and m["source"] == "gguf"
    assert m["family"] == "llama" and m["reason"] is None
    assert m["details"]["layers"] == 4 and m["details"]["vocab_size"] == tiny.BYTE_VOCAB
    assert m["details"]["tensor_types"]["Q8_0"] > 0
    assert m["drafter"] == "z-lab/Qwen3-4B-DFlash-b16"  # the registry, by name


def _header_only(path, arch, tokenizer="gpt2", kind="F32"):
    import gguf

    data = np.zeros((4, 256), np.float32)
    if kind != "F32":
        size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[kind]][1]
        data = np.zeros((4, size), np.uint8)
    gguf_writer.write(
        path,
        {"token_embd.weight": (kind, data)},
        {"general.architecture": arch, "tokenizer.ggml.model": tokenizer},
    )
    return path


def test_refused_ggufs_say_why(tmp_path):
    m = _check(_header_only(tmp_path / "a.gguf", "qwen35"))
    assert not m["loads"] and m["family"] == "qwen3_5" and not m["supported"]
    assert "safetensors" in m["reason"]
    m = _check(_header_only(tmp_path / "b.gguf", "llama", tokenizer="llama"))
    assert not m["loads"] and m["supported"] and "'llama'" in m["reason"]
    m = _check(_header_only(tmp_path / "c.gguf", "llama", kind="Q8_K"))
    assert not m["loads"] and "Q8_K" in m["reason"]
    m = _check(tmp_path / "missing.gguf")
    assert not m["loads"] and "does not exist" in m["reason"]


def test_folders(llama_dir, tmp_path):
    m = _check(llama_dir)
    assert m["loads"] and m["source"] == "folder" and m["family"] == "llama"
    assert m["details"]["hidden_size"] == 64 and m["drafter"] is None
    odd = shutil.copytree(llama_dir, tmp_path / "odd")
    config = json.loads((odd / "config.json").read_text())
    (odd / "config.json").write_text(json.dumps(config | {"model_type": "mamba"}))
    m = _check(odd)
    assert not m["loads"] and m["family"] == "mamba" and "qwen3" in m["reason"]
    (odd / "config.json").write_text(json.dumps(config))
    (odd / "model.safetensors").unlink()
    m = _check(odd)
    assert not m["loads"] and m["supported"] and "incomplete" in m["reason"]


def test_hub_ids_only_from_the_cache(llama_dir, tmp_path, monkeypatch):
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path))
    m = _check("someone/Qwen3-8B")
    assert not m["loads"] and "hf download someone/Qwen3-8B" in m["reason"]
    assert m["drafter"] == "z-lab/Qwen3-8B-DFlash-b16"
    repo = tmp_path / "models--someone--Qwen3-8B"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text("abc123")
    shutil.copytree(llama_dir, repo / "snapshots" / "abc123")
    m = _check("someone/Qwen3-8B")
    assert m["loads"] and m["source"] == "hub cache" and m["family"] == "llama"
    assert m["path"] == str(repo / "snapshots" / "abc123")
    m = _check("not-a-repo-id")
    assert not m["loads"] and "owner/name" in m["reason"]


def test_rendered_report_and_builtin_drafter(tmp_path):
    out = _doctor("--model", default_target())
    for field in ["Will load", "Family", "llama (supported)", "Built-in drafter"]:
        assert field in out
    out = _doctor("--model", str(_header_only(tmp_path / "g.gguf", "gemma4")))
    assert "Why not" in out and "gemma4" in out and "fix:" in out


@pytest.mark.parametrize(
    "name, family, drafter",
    [
        ("gemma-4-31b-it-4bit", "gemma4", "z-lab/gemma-4-31B-it-DFlash"),
        ("gemma-4-26b-a4b-it-8bit", "gemma4", "z-lab/gemma-4-26B-A4B-it-DFlash"),
        ("Muse-Glimmer-30B-4bit", "muse_glimmer", "z-lab/Muse-Glimmer-30B-DFlash2"),
        ("Qwen3.8-27B-4bit", "qwen3_5", "z-lab/Qwen3.8-27B-DFlash2"),
    ],
)
def test_newer_registry_targets_load_with_their_drafter(
    tmp_path, name, family, drafter
):
    m = _check(tiny.make_target(tmp_path / name, family))
    assert m["loads"] and m["supported"] and m["family"] == family
    assert m["drafter"] == drafter


def test_a_gemma4_hub_id_names_its_drafter_before_download(tmp_path, monkeypatch):
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path))
    m = _check("mlx-community/gemma-4-31b-it-4bit")
    assert m["drafter"] == "z-lab/gemma-4-31B-it-DFlash"
    assert (
        not m["loads"]
        and "hf download mlx-community/gemma-4-31b-it-4bit" in (m["reason"])
    )


def test_the_hidden_kernels_flag():
    """`dflash-mlx --kernels mlx ...` runs the command on MLX's generic kernels, and
    only that command."""
    from dflash_mlx import backend

    before = backend.for_device().name
    generic = CliRunner().invoke(
        app, ["--kernels", "mlx", "doctor", "--matmul-size", "0", "--json"]
    )
    assert generic.exit_code == 0, generic.output
    assert json.loads(generic.stdout)["small_products"] == "whole (MLX's own kernels)"
    assert backend.for_device().name == before
    bad = CliRunner().invoke(app, ["--kernels", "metal", "version"])
    assert bad.exit_code == 2 and "--kernels must be one of" in bad.output
