"""Parity with the reference implementation (`dflash` 0.1.0, `dflash.model_mlx`)."""

import mlx.core as mx
import pytest
import tiny
from numerics import assert_close
from oracles import OracleDraft, proposal_logits
from reference_drafter import reference_draft

from dflash_mlx import Target, load, load_draft, stream_generate

ref = pytest.importorskip("dflash.model_mlx")  # installed by the test extra


VARIANTS = {
    "plain": {},
    "sliding": dict(
        layer_types=["sliding_attention", "full_attention"], sliding_window=6
    ),
    "causal": dict(is_causal=True),
    "scaled": dict(
        output_multiplier=0.5, final_logit_softcapping=3.0, input_embedding_scale=1.5
    ),
}


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_draft_logits_match_reference(models_dir, variant):
    t = models_dir / "qwen3-target"
    if not t.exists():
        tiny.make_target(t, "qwen3")
    d = tiny.make_draft(models_dir / f"qwen3-ref-{variant}", t, **VARIANTS[variant])
    model, _ = load(str(t))
    draft = load_draft(str(d))
    theirs = reference_draft(draft).bind(model)
    target = Target(model, draft.args.target_layer_ids)

    ours_cache, their_cache = draft.make_cache(), theirs.make_cache()
    tokens = [5, 9, 100, 22, 7, 64, 3, 18, 40, 41, 42, 43]
    start = 0
    for ctx_len in (7, 3, 2):  # three draft steps with growing context
        ids = mx.array([tokens[start : start + ctx_len]])
        _, features = target(ids, target.make_cache())  # any features will do
        start += ctx_len
        block = mx.array([[tokens[start - 1]] + [draft.args.mask_token_id] * 5])
        draft.absorb(features, ours_cache)
        h = target.embed(block) * draft.args.input_embedding_scale
        ours = draft.finalize_logits(target.logits(draft(h, ours_cache)[:, 1:]))
        expected = theirs(block, features, their_cache, logits_start=1)
        # the drafter's layers, then the head
        depth = draft.args.num_hidden_layers + 1
        assert_close(ours, expected, depth, f"{variant}, context {ctx_len}")


class RefOracle(ref.DFlashDraftModel):
    def __init__(self, config, reference, wrong):
        super().__init__(config)
        self.reference, self.wrong = reference, wrong

    def __call__(self, inputs, target_hidden, cache, logits_start=0):
        pos = cache[0].offset + target_hidden.shape[1]
        super().__call__(inputs, target_hidden, cache, logits_start)
        return proposal_logits(
            self.reference, pos, inputs.shape[1], self.config.vocab_size, self.wrong
        )[None]


@pytest.mark.parametrize("family", ["qwen3", "qwen3_5"])
@pytest.mark.parametrize("block_size", [4, 8, 16])
def test_block_by_block_acceptance_matches_reference(tiny_pair, family, block_size):
    t, d = tiny_pair(family, block_size=16)  # the largest size compared: never capped
    model, tok = load(str(t))
    their_model, _ = load(str(t))  # the reference wraps layers of the model it is given
    tok.eos_token_ids = set()
    draft = load_draft(str(d))
    prompt = tok.encode("1, 2, 3, 4,")
    greedy = [
        t
        for r in stream_generate(model, None, tok, prompt, max_tokens=48)
        for t in r.tokens
    ]
    wrong = lambda k, i: i % 7 == 0 or i % 11 == 0  # noqa: E731
    ours = OracleDraft(draft.args, prompt + greedy, wrong)
    ours.update(draft.parameters())
    theirs = reference_draft(draft, lambda c: RefOracle(c, prompt + greedy, wrong))

    mine = list(
        stream_generate(model, ours, tok, prompt, block_size=block_size, max_tokens=48)
    )
    their = list(
        ref.stream_generate(
            their_model, theirs, tok, prompt, block_size=block_size, max_tokens=48
        )
    )
    assert (
        [t for r in mine for t in r.tokens]
        == [t for r in their for t in r.tokens]
        == greedy
    )
    # the final block may differ: the reference drafts one token past max_tokens
    assert [r.accepted for r in mine[:-2]] == [
        r.accepted for r in their[: len(mine) - 2]
    ]
    assert (
        len({r.accepted for r in mine[1:-1]}) > 1
    )  # varied acceptance, not one pattern
