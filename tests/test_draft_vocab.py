"""Draft vocabularies: the drafter scores only some tokens; output stays lossless."""

import json

import mlx.core as mx
import numpy as np
import pytest
import tiny
from chisquare import chi2, chi2_critical
from lossless import plain, spec
from mlx.utils import tree_flatten, tree_map
from numerics import assert_close

from dflash_mlx import SamplingParams, load, load_draft, stream_generate
from dflash_mlx.models.draft import Model
from dflash_mlx.models.draft_head import DraftHead, select_draft_vocab
from dflash_mlx.models.target import Target
from dflash_mlx.train.blocks import make_blocks
from dflash_mlx.train.export import export_drafter, init_weights
from dflash_mlx.train.packed import block_loss


def with_vocab(draft, vocab):
    """A copy of `draft` that proposes only from `vocab`."""
    args = type(draft.args)(**{**vars(draft.args), "draft_vocab_size": len(vocab)})
    model = Model(args)
    model.update(draft.parameters())
    model.draft_vocab = mx.array(sorted(vocab), dtype=mx.int32)
    return model


@pytest.fixture(scope="module")
def pair(tiny_pair):
    t, d = tiny_pair("qwen3")
    model, tok = load(str(t))
    return t, model, tok, load_draft(str(d))


@pytest.mark.parametrize("quantized", [False, True])
def test_head_rows_equal_the_full_head(pair, tmp_path, quantized):
    t, model, _, _ = pair
    if quantized:
        model, _ = load(str(tiny.quantize_target(t, tmp_path / "q4", bits=4)))
    target = Target(model)
    vocab = mx.array([0, 3, 17, 200, target.vocab_size - 1], dtype=mx.int32)
    hidden = mx.random.normal((2, 5, target.hidden_size))
    mine = DraftHead(target, vocab)(hidden)
    full = target.logits(hidden)[..., vocab]
    assert mine.shape == (2, 5, 5)
    assert_close(mine, full, 1, "head rows")


class VocabOracle(Model):
    """Proposes the true continuation where the draft vocabulary has it, else 0."""

    def __init__(self, args, reference):
        super().__init__(args)
        self.reference = list(reference)

    def __call__(self, block_embeddings, cache):
        self._pos, self._len = cache[0].offset, block_embeddings.shape[1]
        return super().__call__(block_embeddings, cache)

    def finalize_logits(self, logits):
        index = {t: i for i, t in enumerate(self.draft_vocab.tolist())}
        rows = [
            index.get(self.reference[i], 0) if i < len(self.reference) else 0
            for i in range(self._pos + 1, self._pos + self._len)
        ]
        return mx.eye(logits.shape[-1])[mx.array(rows)] * 100.0


def test_greedy_with_a_draft_vocabulary_equals_plain(pair):
    _, model, tok, draft = pair
    prompt = tok.encode("hello world, this is a test")
    ref = plain(model, tok, prompt, 40)
    continuation = ref[1:]
    # Half of the continuation's distinct tokens are out of reach of the drafter.
    reach = sorted(set(continuation))[::2] + [1, 2]
    oracle = VocabOracle(with_vocab(draft, reach).args, prompt + ref)
    oracle.update(with_vocab(draft, reach).parameters())
    out, responses = spec(model, oracle, tok, prompt, max_tokens=40, block_size=8)
    assert out == ref
    drafted = [t for r in responses for t in r.tokens[: r.from_draft]]
    assert drafted, "the oracle should get some tokens accepted"
    assert set(drafted) <= set(reach)


def test_sampling_with_a_draft_vocabulary_keeps_the_target_distribution(pair):
    _, model, tok, draft = pair
    tok.eos_token_ids = set()
    prompt = tok.encode("The quick brown fox")
    params = SamplingParams(temperature=1.0, top_k=4)

    def probs(prefix):
        return np.array(params.probs(model(mx.array([prefix]))[0, -1]))

    p1 = probs(prompt)
    support = [int(a) for a in np.flatnonzero(p1)]
    # The drafter can reach only half the first token's support (and little else).
    restricted = with_vocab(draft, support[::2] + [5, 6, 7])
    exact = {}
    for a in support:
        p2 = probs(prompt + [a])
        for b in np.flatnonzero(p2):
            exact[(a, int(b))] = p1[a] * p2[b]
    outcomes = list(exact)
    mx.random.seed(3)
    counts = np.zeros(len(outcomes))
    for _ in range(1200):
        responses = list(
            stream_generate(
                model,
                restricted,
                tok,
                prompt,
                block_size=2,
                max_tokens=2,
                temperature=1.0,
                top_k=4,
            )
        )
        counts[outcomes.index(tuple(t for r in responses for t in r.tokens))] += 1
    stat, dof = chi2(counts, [exact[o] for o in outcomes])
    assert stat < chi2_critical(dof), stat


def test_to_target_maps_tokens_and_scatters_q(pair):
    _, model, _, _ = pair
    target = Target(model)
    vocab = mx.array([4, 9, 30], dtype=mx.int32)
    head = DraftHead(target, vocab)
    tokens, q = head.to_target(
        mx.array([2, 0]), mx.array([[0.2, 0.3, 0.5], [1.0, 0.0, 0.0]])
    )
    assert tokens.tolist() == [30, 4]
    assert q.shape == (2, target.vocab_size)
    assert q[0, 30].item() == pytest.approx(0.5) and q[1, 4].item() == 1.0
    assert q.sum(axis=-1).tolist() == pytest.approx([1.0, 1.0])
    assert head.index[30] == 2 and head.index[5] == -1


def test_select_draft_vocab_ranks_responses_then_prompts():
    responses = [[5, 5, 5, 7, 7, 9], [5, 7]]
    prompts = [[1, 1, 1, 2, 5]]
    assert select_draft_vocab(responses, prompts, 2) == [5, 7]
    assert select_draft_vocab(responses, prompts, 4) == [1, 5, 7, 9]
    assert select_draft_vocab(responses, prompts, 10) == [1, 2, 5, 7, 9]
    with pytest.raises(ValueError, match="--draft-vocab"):
        select_draft_vocab(responses, prompts, 0)


def test_loss_ignores_labels_outside_the_vocabulary(pair):
    _, model, _, draft = pair
    target = Target(model, draft.args.target_layer_ids)
    tokens = list(range(10, 40))
    anchors = np.array([3, 10, 20])
    features = mx.random.normal(
        (1, 21, len(draft.args.target_layer_ids) * target.hidden_size)
    )
    blocks = make_blocks(
        tokens, anchors, draft.args.block_size, draft.args.mask_token_id
    )
    full = with_vocab(draft, range(target.vocab_size))
    loss_full, w_full, _ = block_loss(target, full, features, blocks)
    loss_ref, w_ref, _ = block_loss(target, draft, features, blocks)
    depth = draft.args.num_hidden_layers + 2  # the drafter, the head, the loss
    assert_close(loss_full, loss_ref, depth, "loss")
    assert w_full.item() == pytest.approx(w_ref.item(), rel=1e-6)
    some = with_vocab(draft, range(10, 25))  # reaches labels 10..24 only
    _, w_some, _ = block_loss(target, some, features, blocks)
    reachable = (blocks.labels[:, 1:] < 25) * blocks.weights[:, 1:]
    assert w_some.item() == pytest.approx(float(reachable.sum()), rel=1e-6)
    assert 0 < w_some.item() < w_ref.item()


def test_vocabulary_survives_export_load_and_init(pair, tmp_path):
    t, model, _, draft = pair
    restricted = with_vocab(draft, [3, 1, 2, 100])
    out = export_drafter(
        restricted, tmp_path / "d", {"target": str(t)}, dtype=mx.float16
    )
    config = json.loads((out / "config.json").read_text())
    assert config["dflash_config"]["draft_vocab_size"] == 4
    loaded = load_draft(str(out), target=model)
    assert loaded.draft_vocab.tolist() == [1, 2, 3, 100]
    assert loaded.draft_vocab.dtype == mx.int32
    assert "draft_vocab" not in dict(tree_flatten(loaded.trainable_parameters()))
    fresh = with_vocab(draft, [7, 8])
    fresh.update(tree_map(lambda p: p * 0, fresh.trainable_parameters()))
    init_weights(fresh, out)
    assert mx.allclose(
        fresh.fc.weight, draft.fc.weight.astype(mx.float16).astype(mx.float32)
    ).item()
    assert fresh.draft_vocab.tolist() == [7, 8]  # its own vocabulary, not the donor's


def test_vocabulary_beyond_the_target_is_refused(pair, tmp_path):
    t, model, _, draft = pair
    bad = with_vocab(draft, [1, 2, 10**6])
    out = export_drafter(bad, tmp_path / "bad", {"target": str(t)})
    with pytest.raises(ValueError, match="draft vocabulary"):
        load_draft(str(out), target=model)
