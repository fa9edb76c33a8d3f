"""Every target family: lossless at every block size, quantized too, and the registry
only names families that load."""

import json

import pytest
import tiny
from lossless import long_prompt, oracle, plain, spec

from dflash_mlx import load, load_draft
from dflash_mlx.loading.registry import DRAFTERS
from dflash_mlx.models.target import SUPPORTED_MODEL_TYPES

FAMILIES = list(tiny.FAMILIES)


@pytest.fixture(scope="module")
def pair(tiny_pair):
    loaded = {}

    def get(family):
        if family not in loaded:
            t, d = tiny_pair(family)
            model, tok = load(str(t))
            loaded[family] = (model, tok, load_draft(str(d)))
        return loaded[family]

    return get


def test_every_supported_family_is_tested():
    assert set(SUPPORTED_MODEL_TYPES) == set(FAMILIES)


@pytest.mark.parametrize("family", sorted({f for _, f in DRAFTERS.values()}))
def test_registry_names_only_families_that_load(pair, family):
    assert family in SUPPORTED_MODEL_TYPES
    model, _, draft = pair(family)  # load() accepts it, load_draft fits it
    assert model.args.model_type == family


@pytest.mark.parametrize("family", FAMILIES)
def test_lossless_at_every_block_size(pair, family):
    model, tok, draft = pair(family)
    prompt = long_prompt(model, tok, 24)
    ref = plain(model, tok, prompt, 24)
    out, _ = spec(model, draft, tok, prompt, max_tokens=24)  # random drafter
    assert out == ref
    half = oracle(draft, prompt + ref, lambda k, i: i % 5 == 0, block_size=16)
    for block_size in (1, 4, 8, 16, "auto"):
        out, responses = spec(
            model, half, tok, prompt, max_tokens=24, block_size=block_size
        )
        assert out == ref, block_size
    assert max(r.accepted or 0 for r in responses) > 2  # the drafts were used


@pytest.mark.parametrize("family", FAMILIES)
def test_quantized_family_is_lossless(models_dir, tiny_pair, family):
    t, d = tiny_pair(family)
    q = models_dir / f"{family}-q4"
    if not q.exists():
        tiny.quantize_target(t, q, 4)
    model, tok = load(str(q))
    draft = load_draft(str(d))
    prompt = long_prompt(model, tok, 16)
    ref = plain(model, tok, prompt, 16)
    out, _ = spec(model, draft, tok, prompt, max_tokens=16, block_size=8)
    assert out == ref
    full = oracle(draft, prompt + ref)
    out, responses = spec(model, full, tok, prompt, max_tokens=16, block_size=8)
    assert out == ref and max(r.accepted or 0 for r in responses) == 8


@pytest.mark.parametrize("family", FAMILIES)
def test_a_drafter_for_another_target_is_refused(models_dir, tiny_pair, family):
    t, _ = tiny_pair(family)
    n_layers = json.loads((t / "config.json").read_text())["num_hidden_layers"]
    wrong = tiny.make_draft(
        models_dir / f"{family}-wrong-draft",
        t,
        num_target_layers=n_layers + 2,
        target_layer_ids=[0, n_layers + 1],
    )
    model, _ = load(str(t))
    with pytest.raises(ValueError, match="does not fit target.*Fix: use the DFlash"):
        load_draft(str(wrong), target=model)
