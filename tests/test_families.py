"""Every target family: lossless at every block size, quantized too, and the registry
only names families that load."""

import json

import mlx.core as mx
import pytest
import tiny
from lossless import long_prompt, oracle, plain, spec
from numerics import assert_close

from dflash_mlx import Target, load, load_draft
from dflash_mlx.loading.registry import DRAFTERS
from dflash_mlx.models.draft_head import DraftHead
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


def _bare_head(model, hidden):
    """mlx-lm's own head output for `hidden`, before any multiplier or soft-cap."""
    lm = getattr(model, "language_model", model)
    if getattr(lm, "lm_head", None) is not None:
        return lm.lm_head(hidden)
    return lm.model.embed_tokens.as_linear(hidden)


@pytest.mark.parametrize("family", ["gemma4_text", "muse_glimmer"])
def test_a_drafters_own_logit_transform_replaces_the_targets(
    models_dir, tiny_pair, family
):
    t, plain_draft = tiny_pair(family)
    d = tiny.make_draft(
        models_dir / f"{family}-capped-draft",
        t,
        output_multiplier=0.25,
        final_logit_softcapping=5.0,
    )
    model, _ = load(str(t))
    target = Target(model)
    hidden = mx.random.normal((1, 3, target.hidden_size), key=mx.random.key(3))
    bare = _bare_head(model, hidden)
    own = load_draft(str(d))  # z-lab's Gemma-4 and Muse drafters set their own
    got = own.finalize_logits(DraftHead.for_drafter(target, own)(hidden))
    assert_close(got, mx.tanh(bare * 0.25 / 5.0) * 5.0, 1, family)
    none = load_draft(str(plain_draft))  # none set: the target's, applied once
    got = none.finalize_logits(DraftHead.for_drafter(target, none)(hidden))
    assert_close(got, target.softcapped(bare), 1, family)
    assert_close(target.logits(hidden), got, 1, family)


def test_a_muse_glimmer_dflash2_drafter_is_lossless(models_dir, tiny_pair):
    """The shape of z-lab/Muse-Glimmer-30B-DFlash2: DFlash-2, bidirectional sliding
    layers, its own output multiplier and soft-cap."""
    t, _ = tiny_pair("muse_glimmer")
    d = tiny.make_draft(
        models_dir / "muse_glimmer-dflash2",
        t,
        architecture="DFlash2DraftModel",
        conv_kernel_size=2,
        conv_group_size=16,
        selector_rank=8,
        selector_top_k=4,
        layer_types=["sliding_attention", "sliding_attention"],
        sliding_window=6,
        is_causal=False,
        output_multiplier=0.5,
        final_logit_softcapping=20.0,
        block_size=16,
    )
    model, tok = load(str(t))
    draft = load_draft(str(d), target=model)
    prompt = long_prompt(model, tok, 24)
    ref = plain(model, tok, prompt, 24)
    for block_size in (4, 16, "auto"):
        out, _ = spec(model, draft, tok, prompt, max_tokens=24, block_size=block_size)
        assert out == ref, block_size


def test_the_run_uses_the_chosen_kernels(pair, chosen_kernels):
    """`--kernels=mlx` puts every target and drafter on MLX's generic kernels."""
    from dflash_mlx import backend
    from dflash_mlx.engine.loop import as_target

    model, _, draft = pair("qwen3")
    want = (chosen_kernels or backend.for_device()).name
    assert draft.kernels.name == want
    assert as_target(model, draft).kernels.name == want
    assert Target(model).cpu_blocks == (want != "mlx")  # the CPU's stand-ins, or none
