"""End to end: speculative sampling in stream_generate has the target's distribution."""

import mlx.core as mx
import numpy as np
import pytest
from chisquare import chi2, chi2_critical

from dflash_mlx import SamplingParams, load, load_draft, stream_generate
from dflash_mlx.models.draft import Model


class CloseDraft(Model):
    """Proposes from a distorted copy of the target's next-token logits (position 1)."""

    def __init__(self, args, target_model, prompt):
        super().__init__(args)
        self.target_model, self.prompt = target_model, list(prompt)

    def __call__(self, block_embeddings, cache):
        table = self.target_model.model.embed_tokens.weight
        last = mx.argmin(mx.sum(mx.abs(table - block_embeddings[0, 0]), axis=-1)).item()
        self._last, self._len = last, block_embeddings.shape[1]
        return super().__call__(block_embeddings, cache)

    def finalize_logits(self, logits):
        row = self.target_model(mx.array([self.prompt + [self._last]]))[0, -1]
        return mx.broadcast_to(row * 1.7, (self._len - 1, row.shape[-1]))


class ConfidenceCut:
    """Verifies only the drafts the drafter is fairly sure of: the cut depends on q."""

    def __init__(self, threshold):
        self.threshold, self.kept = threshold, []

    def next(self, limit=None):
        return 3 if limit is None else max(1, min(3, limit))

    def cut(self, confidence):
        keep = next(
            (i for i, c in enumerate(confidence) if c < self.threshold), len(confidence)
        )
        self.kept.append(keep)
        return keep

    def observe(self, size, n_accepted, seconds, **measured):
        pass


@pytest.mark.parametrize(
    "family, cut",
    [
        pytest.param("qwen3", True, marks=pytest.mark.slow),
        ("qwen3_5", False),  # the hybrid: the rollback most likely to go wrong
        pytest.param("qwen3_moe", False, marks=pytest.mark.slow),
    ],
)
def test_sampled_generation_matches_target_distribution(tiny_pair, family, cut):
    """Dense, hybrid (GatedDeltaNet replay on rejection) and MoE targets."""
    t, d = tiny_pair(family)
    model, tok = load(str(t))
    tok.eos_token_ids = set()
    draft = load_draft(str(d))
    prompt = tok.encode("The quick brown fox")
    params = SamplingParams(temperature=1.0, top_k=3)
    close = CloseDraft(draft.args, model, prompt)
    close.update(draft.parameters())

    def probs(prefix):
        return np.array(params.probs(model(mx.array([prefix]))[0, -1]))

    exact = {}
    p1 = probs(prompt)
    for a in np.flatnonzero(p1):
        p2 = probs(prompt + [int(a)])
        for b in np.flatnonzero(p2):
            p3 = probs(prompt + [int(a), int(b)])
            for c in np.flatnonzero(p3):
                exact[(int(a), int(b), int(c))] = p1[a] * p2[b] * p3[c]
    outcomes = list(exact)

    mx.random.seed(7)
    counts = np.zeros(len(outcomes))
    accepted = 0
    # The drafter's top probability after each first token; cut below their median.
    tops = [
        float(params.probs(model(mx.array([prompt + [int(a)]]))[0, -1] * 1.7).max())
        for a in np.flatnonzero(p1)
    ]
    policy = ConfidenceCut(float(np.median(tops))) if cut else 3
    for i in range(1500):
        # qwen3_5 draws from MLX's global generator, the others from per-generation
        # keys (seed=i): both must give the target's distribution
        responses = list(
            stream_generate(
                model,
                close,
                tok,
                prompt,
                block_size=policy,
                max_tokens=3,
                temperature=1.0,
                top_k=3,
                seed=None if family == "qwen3_5" else i,
            )
        )
        seq = tuple(t for r in responses for t in r.tokens)
        counts[outcomes.index(seq)] += 1
        accepted += responses[1].from_draft
    stat, dof = chi2(counts, [exact[o] for o in outcomes])
    assert stat < chi2_critical(dof), stat
    assert 200 < accepted < 1400  # the draft is accepted often, but not always
    if cut:  # some blocks were verified, some decoded plainly
        assert {0, 1} <= set(policy.kept)
