"""Several sequences verified together (engine/batch.py) get exactly what each gets
alone: greedy tokens equal plain decoding while others join and leave, seeded samples
equal their solo samples, unseeded ones keep the target's distribution."""

import mlx.core as mx
import numpy as np
import pytest
from chisquare import chi2, chi2_critical
from lossless import plain
from oracles import RowOracleDraft

from dflash_mlx import SamplingParams, load, load_draft, stream_generate
from dflash_mlx.engine.batch import Batch, Request
from dflash_mlx.engine.loop import as_target
from dflash_mlx.engine.policy import FixedBlockSize
from dflash_mlx.engine.prefill import first_token, prefill
from dflash_mlx.engine.processors import Processors
from dflash_mlx.generate import make_prompt_cache
from dflash_mlx.kernels import MLX
from dflash_mlx.models.draft import Model
from dflash_mlx.models.target import Target
from dflash_mlx.sampling import SeededNoise

FAMILIES = ["llama", "qwen3", "qwen3_5", "qwen3_moe", "gemma4_text", "gpt_oss"]
TEXTS = ["hello world, this is a test", "1, 2, 3, 4,", "The quick brown fox", "abc"]
N = 24


def _pair(tiny_pair, family, kernels=None):
    t, d = tiny_pair(family)
    model, tok = load(str(t))
    draft = load_draft(str(d), target=model)
    if kernels is not None:
        draft.use_kernels(kernels)
        return Target(model, draft.args.target_layer_ids, kernels), draft, model, tok
    return as_target(model, draft), draft, model, tok


def _start(batch, target, draft, ids, request):
    """Prefill `ids` alone and join the batch: (member or None, first token)."""
    cache = make_prompt_cache(target, draft, windows=False)  # as the server's
    logits = prefill(target, draft, cache, ids, 2048)
    seeded = None
    if request.seed is not None and not request.params.greedy:
        seeded = SeededNoise(request.seed)
    processors = Processors.of(request.logits_processors or None)
    token, _ = first_token(
        target, request.params, seeded, logits, len(ids), 0, processors, ids
    )
    if token in request.stop_tokens:
        return None, token
    return batch.join(request, cache, token), token


def _run(batch, target, draft, prompts, requests, joins, references=None):
    """Decode every prompt, joining the batch at steps `joins`; tokens per prompt.
    `references`: each prompt's expected tokens, for a RowOracleDraft."""
    out, members, step = {}, {}, 0
    pending = list(range(len(prompts)))
    while pending or len(batch):
        for i in [i for i in pending if joins[i] <= step]:
            pending.remove(i)
            member, token = _start(batch, target, draft, prompts[i], requests[i])
            out[i] = [token]
            if member is not None:
                members[member] = i
                if references is not None:
                    draft.references[member] = prompts[i] + references[i]
        for member, block in batch.step():
            out[members[member]] += block.tokens
            if block.finished or member.room <= 0:
                batch.leave(member, make_prompt_cache(target, draft, windows=False))
        step += 1
    return [out[i] for i in range(len(prompts))]


@pytest.mark.parametrize("kernels", [None, MLX], ids=["device", "mlx"])
@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("size", [2, 4, "auto"])
def test_batched_greedy_equals_plain_decoding(tiny_pair, family, size, kernels):
    """Four sequences joining at different steps and leaving when done, drafted by
    an oracle that is right for a while then wrong (multi-token accepts, rejections
    and per-row rollbacks): every one equals mlx-lm's greedy decoding."""
    target, base, model, tok = _pair(tiny_pair, family, kernels)
    oracle = RowOracleDraft(base.args, wrong=lambda k, i: (i // 3) % 3 == 2)
    oracle.update(base.parameters())
    oracle.use_kernels(target.kernels)
    prompts = [tok.encode(t) for t in TEXTS]
    stops = frozenset(tok.eos_token_ids)
    expected = [plain(model, tok, ids, N) for ids in prompts]
    policy = size
    if size == "auto":
        from dflash_mlx.engine.policy import AdaptiveBlockSize

        policy = AdaptiveBlockSize(8)
    batch = Batch(target, oracle, policy)
    oracle.batch = batch
    requests = [
        Request(max_tokens=N - 3 * (i % 2), stop_tokens=stops) for i in range(4)
    ]
    got = _run(batch, target, oracle, prompts, requests, [0, 0, 2, 5], expected)
    for i, request in enumerate(requests):
        assert got[i] == expected[i][: request.max_tokens], f"prompt {i}"
    assert batch.caches is None and not batch.members  # all left: nothing held


class WidthsSeen(FixedBlockSize):
    """A fixed size that records the widths the batch announces."""

    def __init__(self, size):
        super().__init__(size)
        self.widths = []

    def at_width(self, width):
        self.widths.append(width)


def test_the_batch_times_its_blocks_per_width(tiny_pair):
    """Each step tells the policy how many rows it verifies (free rows included):
    t(B) depends on it (engine/policy.py keeps timings per width)."""
    target, draft, model, tok = _pair(tiny_pair, "qwen3")
    prompts = [tok.encode(t) for t in TEXTS]
    stops = frozenset(tok.eos_token_ids)
    policy = WidthsSeen(2)
    batch = Batch(target, draft, policy)
    requests = [Request(max_tokens=N - 6 * i, stop_tokens=stops) for i in range(4)]
    _run(batch, target, draft, prompts, requests, [0, 0, 2, 5])
    assert policy.widths[:2] == [2, 2] and policy.widths[2] == 3
    assert max(policy.widths) == 4 and policy.widths[-1] >= 1


def test_seeded_samples_are_the_solo_samples(tiny_pair):
    """A seeded sampled sequence draws the same tokens batched beside others (greedy
    and other seeds) as alone through stream_generate."""
    target, draft, model, tok = _pair(tiny_pair, "qwen3")
    prompts = [tok.encode(t) for t in TEXTS]
    params = SamplingParams(temperature=0.9, top_p=0.95)
    stops = frozenset(tok.eos_token_ids)
    requests = [
        Request(params, N, stops, seed=11),
        Request(max_tokens=N, stop_tokens=stops),
        Request(params, N, stops, seed=12),
        Request(SamplingParams(temperature=1.3), N, stops, seed=13),
    ]
    got = _run(Batch(target, draft, 4), target, draft, prompts, requests, [0, 0, 1, 3])
    for i, (ids, r) in enumerate(zip(prompts, requests, strict=True)):
        alone = stream_generate(
            target, draft, tok, ids, block_size=4, max_tokens=N,
            temperature=r.params.temperature, top_p=r.params.top_p, seed=r.seed,
        )  # fmt: skip
        assert got[i] == [t for resp in alone for t in resp.tokens], f"prompt {i}"


class CloseRows(Model):
    """Each row proposes from a distorted copy of the target's next-token logits."""

    def __init__(self, args, target_model, prompt):
        super().__init__(args)
        self.target_model, self.prompt = target_model, list(prompt)

    def __call__(self, block_embeddings, cache):
        table = self.target_model.model.embed_tokens.weight
        distance = mx.abs(table[None] - block_embeddings[:, 0][:, None]).sum(-1)
        self._lasts = mx.argmin(distance, axis=-1).tolist()
        self._len = block_embeddings.shape[1]
        return super().__call__(block_embeddings, cache)

    def finalize_logits(self, logits):
        rows = []
        for last in self._lasts:
            row = self.target_model(mx.array([self.prompt + [last]]))[0, -1]
            rows.append(mx.broadcast_to(row * 1.7, (self._len - 1, row.shape[-1])))
        return mx.stack(rows)


def test_unseeded_batched_sampling_has_the_target_distribution(tiny_pair):
    """Rejection sampling row by row in a batch of 4: the 2-token outcomes follow the
    target's distribution (chi-square), with drafts accepted often but not always."""
    target, draft, model, tok = _pair(tiny_pair, "qwen3")
    prompt = tok.encode("The quick brown fox")
    params = SamplingParams(temperature=1.0, top_k=3)
    close = CloseRows(draft.args, model, prompt)
    close.update(draft.parameters())
    close.use_kernels(target.kernels)

    def probs(prefix):
        return np.array(params.probs(model(mx.array([prefix]))[0, -1]))

    exact = {}
    p1 = probs(prompt)
    for a in np.flatnonzero(p1):
        p2 = probs(prompt + [int(a)])
        for b in np.flatnonzero(p2):
            exact[(int(a), int(b))] = p1[a] * p2[b]
    outcomes = list(exact)
    counts, accepted = np.zeros(len(outcomes)), 0
    mx.random.seed(3)
    request = Request(params, 3, frozenset())  # room for a block of 2
    for _ in range(300):
        batch = Batch(target, close, 2)
        members = [_start(batch, target, close, prompt, request) for _ in range(4)]
        firsts = {m: t for m, t in members}
        for member, block in batch.step():
            counts[outcomes.index((firsts[member], block.tokens[0]))] += 1
            accepted += block.from_draft
    stat, dof = chi2(counts, [exact[o] for o in outcomes])
    assert stat < chi2_critical(dof), stat
    assert 100 < accepted < 1100


def test_a_sequence_that_leaves_continues_alone_as_it_would_have(tiny_pair):
    """The caches a leaving sequence takes out are its own, exactly: continuing from
    them alone gives the tokens it would have got in the batch (plain decoding's)."""
    target, draft, model, tok = _pair(tiny_pair, "qwen3_5")
    prompts = [tok.encode(t) for t in TEXTS[:2]]
    stops = frozenset(tok.eos_token_ids)
    batch = Batch(target, draft, 4)
    (a, first), (b, _) = [
        _start(batch, target, draft, ids, Request(max_tokens=N, stop_tokens=stops))
        for ids in prompts
    ]
    tokens = [first]
    for _ in range(3):
        tokens += next(blk.tokens for m, blk in batch.step() if m is a)
    cache = batch.leave(a, make_prompt_cache(target, draft, windows=False))
    assert len(batch) == 1 and cache.tokens == prompts[0] + tokens[:-1]
    rest = stream_generate(
        target, draft, tok, cache.tokens + tokens[-1:], prompt_cache=cache,
        max_tokens=N - len(tokens), block_size=4,
    )  # fmt: skip
    tokens += [t for r in rest for t in r.tokens]
    assert tokens == plain(model, tok, prompts[0], N)


@pytest.mark.parametrize("family", ["qwen3", "qwen3_5"])
def test_lookup_copies_in_a_batch_stay_lossless(tiny_pair, family):
    """Rows whose history repeats verify lookup copies (alone or spliced before the
    drafter's drafts) beside rows that draft: greedy rows equal plain decoding,
    seeded sampled rows their solo samples."""
    target, draft, model, tok = _pair(tiny_pair, family)
    texts = [
        "abc abc abc abc abc ab",
        "1, 2, 3, 1, 2, 3, 1, 2,",
        "hello world",
        "xy xy x",
    ]
    prompts = [tok.encode(t) for t in texts]
    stops = frozenset(tok.eos_token_ids)
    params = SamplingParams(temperature=0.8)
    requests = [
        Request(max_tokens=N, stop_tokens=stops),
        Request(params, N, stops, seed=5),
        Request(max_tokens=N, stop_tokens=stops),
        Request(params, N, stops, seed=6),
    ]
    batch = Batch(target, draft, 4, lookup=True)  # a fixed size splices every copy
    sources = []
    step = batch.step

    def recording_step():
        out = step()
        sources.extend(b.source for _, b in out)
        return out

    batch.step = recording_step
    got = _run(batch, target, draft, prompts, requests, [0, 0, 1, 2])
    assert {"lookup", "splice"} & set(sources), sources
    for i, (ids, r) in enumerate(zip(prompts, requests, strict=True)):
        if r.params.greedy:
            assert got[i] == plain(model, tok, ids, N), f"prompt {i}"
            continue
        alone = stream_generate(
            target, draft, tok, ids, max_tokens=N, temperature=0.8, seed=r.seed
        )
        assert got[i] == [t for resp in alone for t in resp.tokens], f"prompt {i}"
