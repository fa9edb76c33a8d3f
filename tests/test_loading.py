"""Loading errors are ValueErrors that name the models and say how to fix them."""

import json
import shutil

import mlx.core as mx
import pytest
import tiny

from dflash_mlx import check_compatible, load, load_draft, stream_generate


@pytest.fixture(scope="module")
def target(models_dir):
    path = models_dir / "llama-target"
    if not path.exists():
        tiny.make_target(path, "llama")
    return path


@pytest.fixture(scope="module")
def loaded_target(target):
    return load(str(target))


@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(hidden_size=32), "hidden size 32 vs 64"),
        (dict(vocab_size=300), "vocabulary 300 vs 272"),
        (dict(target_layer_ids=[1, 7]), "outside 0..3"),
        (
            dict(num_target_layers=36, target_layer_ids=[1, 2]),
            "expects 36 target layers",
        ),
        (dict(mask_token_id=5000), "mask_token_id 5000"),
    ],
)
def test_drafter_that_does_not_fit(tmp_path, target, loaded_target, overrides, message):
    d = tiny.make_draft(tmp_path / "d", target, **overrides)
    model, tok = loaded_target
    draft = load_draft(str(d))
    with pytest.raises(ValueError) as err:
        check_compatible(model, draft)
    text = str(err.value)
    assert message in text and str(d) in text and str(target) in text and "Fix:" in text
    with pytest.raises(ValueError, match="does not fit"):
        load_draft(str(d), target=model)
    with pytest.raises(ValueError, match="does not fit"):
        next(stream_generate(model, draft, tok, "hi"))


def test_missing_and_corrupt_files(tmp_path, target):
    d = tiny.make_draft(tmp_path / "d", target)
    (d / "config.json").rename(d / "config.bak")
    with pytest.raises(ValueError, match="no config.json"):
        load_draft(str(d))
    (d / "config.json").write_text("{ not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        load_draft(str(d))
    (d / "config.bak").rename(d / "config.json")
    weights = d / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    with pytest.raises(ValueError, match="corrupt or incomplete"):
        load_draft(str(d))
    weights.unlink()
    with pytest.raises(ValueError, match="no \\*.safetensors"):
        load_draft(str(d))


def test_weights_that_do_not_match_config(tmp_path, target):
    d = tiny.make_draft(tmp_path / "d", target)
    w = mx.load(str(d / "model.safetensors"))
    w.pop("fc.weight")
    mx.save_safetensors(str(d / "model.safetensors"), w)
    with pytest.raises(ValueError, match="missing \\['fc.weight'\\]"):
        load_draft(str(d))


@pytest.mark.parametrize(
    "field, value, tensor",
    [
        ("intermediate_size", 96, "layers.0.mlp.down_proj.weight"),
        ("num_key_value_heads", 4, "layers.0.self_attn.k_proj.weight"),
    ],
)
def test_an_edited_config_names_the_field_and_the_tensor(
    tmp_path, target, field, value, tensor
):
    d = tiny.make_draft(tmp_path / "d", target)
    config = json.loads((d / "config.json").read_text())
    stored = config[field]
    config[field] = value
    (d / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError) as e:
        load_draft(str(d))
    message = str(e.value)
    assert f"tensor {tensor} is stored as" in message
    assert f"{field}" in message and str(value) in message
    assert "Restore the drafter's original config.json" in message
    config[field] = stored  # restored, it loads
    (d / "config.json").write_text(json.dumps(config))
    load_draft(str(d))


def test_unsupported_drafter_architecture(tmp_path, target):
    d = tiny.make_draft(tmp_path / "d", target)
    cfg = json.loads((d / "config.json").read_text())
    cfg["architectures"] = ["EagleDraftModel"]
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="supported drafters: DFlashDraftModel"):
        load_draft(str(d))


def test_unsupported_target(tmp_path, target):
    t = tmp_path / "t"
    shutil.copytree(target, t)
    cfg = json.loads((t / "config.json").read_text())
    cfg["model_type"] = "rwkv7"
    (t / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="DFlash targets supported here: llama"):
        load(str(t))


def test_offline_without_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    import huggingface_hub.constants as c

    monkeypatch.setattr(c, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(c, "HF_HUB_CACHE", str(tmp_path / "hub"))
    with pytest.raises(
        ValueError, match="not in the local Hugging Face cache and HF_HUB_OFFLINE"
    ):
        load("z-lab/Qwen3-4B-DFlash-b16")
    with pytest.raises(ValueError, match="hf download z-lab/Qwen3-4B-DFlash-b16"):
        load_draft("z-lab/Qwen3-4B-DFlash-b16")


def test_bad_paths():
    with pytest.raises(
        ValueError, match="neither an existing folder nor a Hugging Face repo id"
    ):
        load("./no/such/folder")
    with pytest.raises(ValueError, match="is a file"):
        load_draft(__file__)


def test_bad_generation_arguments(loaded_target):
    model, tok = loaded_target
    with pytest.raises(ValueError, match="max_tokens"):
        next(stream_generate(model, None, tok, "hi", max_tokens=0))
    with pytest.raises(ValueError, match="block_size"):
        next(stream_generate(model, None, tok, "hi", block_size=-1))
    with pytest.raises(ValueError, match="temperature"):
        next(stream_generate(model, None, tok, "hi", temperature=-0.5))
    with pytest.raises(ValueError, match="empty"):
        next(stream_generate(model, None, tok, []))
