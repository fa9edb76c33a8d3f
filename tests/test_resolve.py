"""Which models to load: the built-in pair, the registry, --no-draft."""

import sys
import types

import pytest

from dflash_mlx.loading.resolve import context_length, resolve_models


def test_resolve_models_with_registry(monkeypatch):
    reg = types.ModuleType("dflash_mlx.loading.registry")
    reg.drafter_for = lambda target: {"org/T": "org/T-DFlash"}.get(target)
    monkeypatch.setitem(sys.modules, "dflash_mlx.loading.registry", reg)
    assert resolve_models("org/T", None) == ("org/T", "org/T-DFlash", None)
    assert resolve_models("org/T", "my/draft") == ("org/T", "my/draft", None)
    assert resolve_models("org/U", None) == (
        "org/U",
        None,
        "no drafter: plain decoding; pass --draft",
    )
    assert resolve_models("org/T", None, no_draft=True)[1] is None


def test_resolve_models_default(monkeypatch):
    # not built yet
    monkeypatch.setitem(sys.modules, "dflash_mlx.loading.defaults", None)
    with pytest.raises(ValueError, match="--model"):
        resolve_models(None, None)
    fake = types.ModuleType("dflash_mlx.loading.defaults")
    fake.default_target, fake.default_draft = (
        (lambda: "org/Default"),
        (lambda: "org/Default-D"),
    )
    monkeypatch.setitem(sys.modules, "dflash_mlx.loading.defaults", fake)
    assert resolve_models(None, None) == ("org/Default", "org/Default-D", None)


def test_context_length_from_the_config_or_its_text_config():
    class Args:
        max_position_embeddings = 4096

    class Nested:
        text_config = {"max_position_embeddings": 8192}

    assert context_length(types.SimpleNamespace(args=Args())) == 4096
    assert context_length(types.SimpleNamespace(args=Nested())) == 8192
    assert context_length(types.SimpleNamespace(args=None)) is None
