"""DFlash-2 drafters: numerically equal to the reference, lossless in the loop."""

import mlx.core as mx
import pytest
import tiny
from lossless import long_prompt, plain, spec
from mlx.utils import tree_flatten
from numerics import assert_close
from reference_drafter import reference_draft

from dflash_mlx import SamplingParams, Target, load, load_draft, stream_generate
from dflash_mlx.models.dflash2 import Model as DFlash2

ref = pytest.importorskip("dflash.model_mlx")

V2 = dict(
    architecture="DFlash2DraftModel",
    conv_kernel_size=3,
    conv_group_size=16,
    selector_rank=8,
    selector_top_k=6,
)


@pytest.fixture(scope="module")
def pair(models_dir):
    t = models_dir / "qwen3-target"
    if not t.exists():
        tiny.make_target(t, "qwen3")
    d = tiny.make_draft(models_dir / "qwen3-dflash2", t, **V2)
    model, tok = load(str(t))
    return model, tok, load_draft(str(d))


def reference_v2(draft):
    return reference_draft(draft, ref.DFlash2DraftModel)


def test_loads_as_dflash2(pair):
    _, _, draft = pair
    assert isinstance(draft, DFlash2)
    names = {k for k, _ in tree_flatten(draft.parameters())}
    assert "candidate_selector.predecessor_codebook.weight" in names
    assert "layers.0.attention_conv.base_kernel" in names


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_logits_and_proposals_match_reference(pair, temperature):
    model, tok, draft = pair
    theirs = reference_v2(draft).bind(model)
    target = Target(model, draft.args.target_layer_ids)
    prompt = mx.array([tok.encode("The quick brown fox jumps")])
    _, features = target(prompt, target.make_cache())
    anchor = prompt[0, -1].item()
    block = mx.array([[anchor] + [draft.args.mask_token_id] * 7])

    cache = draft.make_cache()
    draft.absorb(features, cache)
    h = draft(target.embed(block), cache)[0, 1:]
    logits = draft.finalize_logits(target.logits(h))
    their_hidden = theirs.hidden_states(
        block, features, theirs.make_cache(), logits_start=1
    )
    their_logits = theirs.compute_logits(their_hidden)
    depth = draft.args.num_hidden_layers + 1  # the drafter's layers, then the head
    assert_close(logits, their_logits[0], depth, "drafter logits")

    params = SamplingParams(temperature=temperature)
    mx.random.seed(3)
    picks, q = draft.propose(h, logits, mx.array(anchor), params)
    mx.random.seed(3)
    their_picks, candidates, their_q = theirs.candidate_selector.select(
        their_hidden, their_logits, block[:, 0], temperature
    )
    assert picks.tolist() == their_picks[0].tolist()
    if temperature:
        dense = mx.put_along_axis(mx.zeros_like(q), candidates[0], their_q[0], axis=-1)
        assert_close(q, dense, depth + 1, "candidate probabilities")
        assert mx.allclose(q.sum(axis=-1), mx.ones(q.shape[0]), atol=1e-5)
    else:
        assert q is None


def test_dflash2_generation_is_lossless(pair):
    model, tok, draft = pair
    prompt = long_prompt(model, tok, 24)
    out, _ = spec(model, draft, tok, prompt, max_tokens=24)
    assert out == plain(model, tok, prompt, 24)


def test_dflash2_sampling_runs(pair):
    model, tok, draft = pair
    mx.random.seed(0)
    out = [
        t
        for r in stream_generate(
            model, draft, tok, "hello", max_tokens=16, temperature=0.9, top_p=0.95
        )
        for t in r.tokens
    ]
    assert 1 <= len(out) <= 16


def test_quantized_dflash2_keeps_selector(pair, models_dir):
    d = models_dir / "qwen3-dflash2"
    quant = load_draft(str(d), bits=8)
    import mlx.nn as nn

    assert isinstance(quant.candidate_selector.hidden_projection, nn.Linear)
    assert isinstance(
        quant.layers[0].attention_conv.kernel_projection, nn.QuantizedLinear
    )
