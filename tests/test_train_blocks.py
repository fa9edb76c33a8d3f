"""Anchors, block inputs, loss weights, the packed mask; packed forward == inference."""

import math

import mlx.core as mx
import numpy as np
import pytest
from numerics import assert_close

from dflash_mlx import Target, load, load_draft
from dflash_mlx.train.blocks import (
    default_gamma,
    make_blocks,
    packed_mask,
    position_weights,
    sample_anchors,
)
from dflash_mlx.train.packed import block_loss, embed_blocks, packed_hidden


def test_anchors_stay_inside_the_response():
    rng = np.random.default_rng(0)
    for _ in range(50):
        a = sample_anchors(rng, prompt_len=7, seq_len=30, n=10)
        assert len(a) == 10 and len(set(a.tolist())) == 10
        assert a.min() >= 7 and a.max() <= 28 and (np.diff(a) > 0).all()
    assert len(sample_anchors(rng, 7, 12, n=100)) == 4  # positions 7..10 only
    assert (
        len(sample_anchors(rng, 7, 8, n=5)) == 0
    )  # one response token: nothing to predict


def test_block_inputs_labels_and_weights():
    tokens = np.arange(100, 120)
    b = make_blocks(tokens, np.array([5, 16]), block_size=8, mask_id=999)
    assert b.inputs[0].tolist() == [105] + [999] * 7
    assert b.labels[0, 1:].tolist() == list(range(106, 113))
    # second block runs past the end (positions 16..23, tokens end at 19)
    assert b.labels[1, 1:4].tolist() == [117, 118, 119]
    assert (b.weights[1, 4:] == 0).all() and (b.weights[:, 0] == 0).all()
    assert b.weights[0, 1] == pytest.approx(1.0)


@pytest.mark.parametrize("B,gamma", [(16, 7), (10, 5), (8, 4)])
def test_loss_weights_follow_the_paper(B, gamma):
    assert default_gamma(B) == gamma
    w = position_weights(B)
    assert w[0] == 0
    for k in range(1, B):
        assert w[k] == pytest.approx(math.exp(-(k - 1) / gamma), rel=1e-6)
    assert (np.diff(w[1:]) < 0).all()


def test_mask_blocks_see_only_their_past_context_and_themselves():
    anchors, B, C = np.array([3, 5, 9]), 4, 9
    m = packed_mask(anchors, B, C)
    ctx = np.array(m.context)
    assert ctx.shape == (12, C) and m.block is None  # the whole own block, no other
    for i, a in enumerate(anchors):
        for j in range(B):
            assert ctx[i * B + j].tolist() == [k < a for k in range(C)]
    causal = packed_mask(anchors, B, C, causal=True, window=4)
    row = np.array(causal.context)[1 * B + 2]
    # block at 5, query at position 7: context 4 only (< 5, window 4)
    assert row.tolist() == [k == 4 for k in range(C)]
    assert np.array(causal.block)[2].tolist() == [True, True, True, False]


@pytest.fixture(scope="module")
def setup(tiny_pair):
    t, d = tiny_pair("qwen3", num_layers=2, block_size=8)
    model, _ = load(str(t))
    draft = load_draft(str(d))
    target = Target(model, draft.args.target_layer_ids)
    ids = np.random.default_rng(0).integers(0, 256, 48)
    _, features = target(mx.array(ids)[None], target.make_cache())
    return target, draft, ids, features


def test_packed_training_forward_equals_inference(setup):
    target, draft, ids, features = setup
    anchors = np.array([6, 7, 13, 30, 41])
    blocks = make_blocks(ids, anchors, 8, draft.args.mask_token_id)
    emb = embed_blocks(target, draft, blocks.inputs)
    h = packed_hidden(draft, features[:, : anchors.max()], emb, anchors)
    depth = draft.args.num_hidden_layers
    for i, a in enumerate(anchors):
        cache = draft.make_cache()
        draft.absorb(features[:, :a], cache)
        ref = draft(emb[i : i + 1], cache)
        assert_close(h[i], ref[0], depth, f"block at {a}")
        ref_logits = draft.finalize_logits(target.logits(ref[:, 1:]))
        got_logits = draft.finalize_logits(target.logits(h[i : i + 1, 1:]))
        assert_close(got_logits, ref_logits, depth + 1, f"logits of block at {a}")


def test_a_block_cannot_see_its_future_context_or_another_block(setup):
    target, draft, ids, features = setup
    anchors = np.array([10, 20, 30])
    blocks = make_blocks(ids, anchors, 8, draft.args.mask_token_id)
    emb = embed_blocks(target, draft, blocks.inputs)
    base = packed_hidden(draft, features[:, :30], emb, anchors)
    # change context at/after anchor 20 and the inputs of blocks 0 and 2
    noisy_f = features[:, :30] + mx.where(mx.arange(30)[None, :, None] >= 20, 5.0, 0.0)
    noisy_e = mx.concatenate([emb[:1] + 3.0, emb[1:2], emb[2:] - 3.0])
    moved = packed_hidden(draft, noisy_f, noisy_e, anchors)
    depth = draft.args.num_hidden_layers
    assert_close(moved[1], base[1], depth, "block at 20")  # unaffected
    assert not mx.allclose(
        moved[2], base[2], atol=1e-3
    ).item()  # sanity: the others change
    assert not mx.allclose(moved[0], base[0], atol=1e-3).item()


def test_loss_is_weight_normalised_cross_entropy(setup):
    target, draft, ids, features = setup
    anchors = np.array([8, 16])
    blocks = make_blocks(ids, anchors, 8, draft.args.mask_token_id)
    loss, wsum, _ = block_loss(target, draft, features[:, :16], blocks)
    emb = embed_blocks(target, draft, blocks.inputs)
    logits = draft.finalize_logits(
        target.logits(packed_hidden(draft, features[:, :16], emb, anchors)[:, 1:])
    )
    logp = np.array(logits - mx.logsumexp(logits, axis=-1, keepdims=True))
    ce = -np.take_along_axis(logp, blocks.labels[:, 1:, None], -1)[..., 0]
    w = blocks.weights[:, 1:]
    assert wsum.item() == pytest.approx(w.sum(), rel=1e-6)
    assert loss.item() == pytest.approx((ce * w).sum() / w.sum(), rel=1e-4)


def test_packed_forward_equals_inference_with_sliding_layers(tiny_pair):
    t, d = tiny_pair(
        "llama",
        num_layers=2,
        block_size=4,
        layer_types=("sliding_attention", "full_attention"),
        sliding_window=5,
    )
    model, _ = load(str(t))
    draft = load_draft(str(d))
    target = Target(model, draft.args.target_layer_ids)
    ids = np.random.default_rng(1).integers(0, 256, 30)
    _, features = target(mx.array(ids)[None], target.make_cache())
    anchors = np.array([3, 11, 25])
    emb = embed_blocks(
        target, draft, make_blocks(ids, anchors, 4, draft.args.mask_token_id).inputs
    )
    h = packed_hidden(draft, features[:, :25], emb, anchors)
    for i, a in enumerate(anchors):
        cache = draft.make_cache()
        draft.absorb(features[:, :a], cache)
        expected = draft(emb[i : i + 1], cache)[0]
        assert_close(h[i], expected, draft.args.num_hidden_layers, f"block at {a}")
