"""The speculative-decoding engine: prompt ids in, blocks of committed ids out.

The engine knows nothing about text: it turns prompt ids into blocks of committed ids.
Each block is one drafter forward + one target forward + an acceptance rule, built as
one lazy graph and synced once; the previous block is handed out while it computes.

Words in the engine, one meaning each:
- `last`: the last committed token, whose features the target has not computed yet;
  every block starts from it.
- `drafted`: the block size the policy chose: `last` plus drafted - 1 masked slots the
  drafter fills with proposals (`drafts`).
- `keep_drafts`: the policy's optional choice (its `cut` method) of how many drafts to
  verify, from the drafter's confidences; it costs a second sync per block.
- `verified`: tokens the target verifies, `last` and the drafts kept (1 + kept).
- `accepted`: drafts the target accepted; it commits them plus one token of its own.
- `stop_at`: how many committed tokens to keep, up to and with the first stop token.
- `reused`: prompt tokens the cache already held.
- `unabsorbed`: features of committed tokens the drafter has not taken in yet; it takes
  them in before its next draft, so blocks of 1 leave it idle.
"""

import time
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass
from typing import Union, cast

import mlx.core as mx

from .. import validate
from ..models.cache import PromptCache
from ..models.draft_head import DraftHead
from ..models.target import Target
from ..sampling import SamplingParams, SeededNoise, perturbed, token_logprobs
from .policy import AdaptiveBlockSize, FixedBlockSize
from .verify import accept_greedy, accept_sampled

# Blocks whose features may wait for the drafter's next draft (memory stays bounded
# through a long run of plain blocks; 16 tokens are one native product).
MAX_UNABSORBED = 16

# One committed token's log-probability under the target, and its top (id, logprob)s.
TokenLogprobs = tuple[float, list[tuple[int, float]]]


@dataclass
class Block:
    """Tokens committed by one verify step."""

    tokens: list[int]
    from_draft: int  # how many of `tokens` (a prefix) were the drafter's proposals
    block_size: int  # tokens the target verified in this step (`verified`)
    finished: bool = False  # ended on a stop token
    reused: int = 0  # prompt tokens served from the cache (first block only)
    logprobs: list[TokenLogprobs] | None = None  # one per token, when asked for


def as_target(model, draft) -> Target:
    if isinstance(model, Target):
        return model
    ids = draft.args.target_layer_ids if draft is not None else ()
    return Target(model, ids)


def _prefill(
    target: Target, draft, cache: PromptCache, ids: list[int], step: int
) -> mx.array:
    """Feed `ids` through the target (and their features to the drafter); the last
    position's logits."""
    for start in range(0, len(ids), step):
        chunk = mx.array(ids[start : start + step])[None]
        hidden, features = target(chunk, cache.target)
        if draft is not None:
            draft.absorb(features, cache.draft)
        if start + step < len(ids):
            mx.eval([c.state for c in cache.target + (cache.draft or [])])
            mx.clear_cache()
    cache.tokens.extend(ids)
    return target.logits(hidden[:, -1])[0]


def _draft(
    target: Target,
    draft,
    head: DraftHead,
    cache: PromptCache,
    block: mx.array,
    params: SamplingParams,
    noise: mx.array | None,
):
    """One drafter forward over [last, MASK...]: drafts (B-1,), their q (or None when
    greedy), and the drafter's confidence per position (lazy).

    The confidence is the top probability of each position's distribution, a function of
    the distributions only: a cut that looked at the drawn tokens would bias which
    proposals reach the verifier and break exact sampling (tests/test_sampling.py)."""
    h = target.embed(block)
    if draft.args.input_embedding_scale != 1.0:
        h = h * draft.args.input_embedding_scale
    h = draft(h, cache.draft)[0, 1:]
    logits = draft.finalize_logits(head(h.astype(target.dtype)))
    if noise is not None:  # the drafted positions; the draft vocabulary's columns
        noise = noise[: logits.shape[0]]
        noise = noise if head.vocab is None else noise[:, head.vocab]
    tokens, q = draft.propose(h, logits, block[0, 0], params, noise)
    probs = q if q is not None else draft.kernels.softmax(logits)
    confidence = probs.max(axis=-1)
    return (*head.to_target(tokens, q), confidence)


def _accept(params: SamplingParams, drafts, draft_probs, logits: mx.array, noise):
    """(accepted, emitted) for the verified drafts (None: no drafts, plain decoding).

    With a seeded generation's `noise`, the target's draw at each position is the argmax
    of its perturbed log-probabilities: drafts are accepted while they equal it."""
    if noise is not None:
        logits = perturbed(params.probs(logits), noise[: logits.shape[0]])
    if drafts is None:
        emitted = mx.argmax(logits, -1) if noise is not None else params.sample(logits)
        return mx.array(0), emitted
    if params.greedy or noise is not None:
        return accept_greedy(drafts, logits)
    if draft_probs is None:
        raise ValueError("The drafter sampled its proposals without returning their q.")
    return accept_sampled(drafts, draft_probs, params.probs(logits))


class _Step:
    """One drafted-and-verified block in flight (lazy until `resolve`).

    With `keep_drafts` (the adaptive policy's `cut`), the drafts are evaluated first and
    only the prefix it chooses from the drafter's confidences is verified: a second sync
    per block, paid back where verifying fewer tokens is cheaper (CPUs). The choice
    depends on the drafter alone, so greedy and sampled output stay exact.
    """

    def __init__(
        self,
        target: Target,
        draft,
        head: DraftHead | None,
        cache: PromptCache,
        last: int,
        drafted: int,
        params: SamplingParams,
        mask_id: int,
        keep_drafts: Callable[[list], int] | None = None,
        seeded: SeededNoise | None = None,
        top_logprobs: int = 0,
    ):
        self.drafted = drafted
        noise = None  # the positions after `last`: drafts, then the target's rows
        if seeded is not None and not params.greedy:
            noise = seeded.at(len(cache.tokens) + 1, drafted, target.vocab_size)
        self.tape: list | None = [] if target.recurrent else None
        block = mx.array([[last] + [mask_id] * (drafted - 1)])
        drafts = draft_probs = None
        if drafted > 1 and head is not None:
            drafts, draft_probs, confidence = _draft(
                target, draft, head, cache, block, params, noise
            )
            if keep_drafts is not None:
                mx.eval(drafts, confidence, draft_probs)
                kept = keep_drafts(confidence.tolist())
                drafts = drafts[:kept]
                draft_probs = None if draft_probs is None else draft_probs[:kept]
        self.verify_start = time.perf_counter()
        if drafts is not None and drafts.shape[0] > 0:
            proposed = drafts.astype(block.dtype)
            verify_ids = mx.concatenate([block[0, :1], proposed])[None]
        else:
            drafts, verify_ids = None, block[:, :1]
        self.verified = verify_ids.shape[1]
        hidden, self.features = target(verify_ids, cache.target, self.tape)
        logits = target.logits(hidden)[0]
        accepted, emitted = _accept(params, drafts, draft_probs, logits, noise)
        self.result = mx.concatenate([accepted[None].astype(emitted.dtype), emitted])
        self.logprobs = None
        if top_logprobs > 0:
            self.logprobs = token_logprobs(logits, emitted, top_logprobs)
        mx.async_eval(self.result, *(self.logprobs or ()))

    def resolve(self) -> tuple[int, list[int], list[TokenLogprobs] | None]:
        """Sync: (drafts accepted, committed tokens, their logprobs or None)."""
        values = cast(list[int], self.result.tolist())
        n = values[0] + 1
        return values[0], values[1 : n + 1], _logprob_rows(self.logprobs, n)


def _logprob_rows(arrays, n: int) -> list[TokenLogprobs] | None:
    """The first `n` rows of `token_logprobs`' arrays as Python values."""
    if arrays is None:
        return None
    chosen, ids, values = (a[:n].tolist() for a in arrays)
    rows = zip(chosen, ids, values, strict=True)
    return [(c, list(zip(i, v, strict=True))) for c, i, v in rows]


def generate_blocks(
    target: Target,
    draft,
    prompt: Sequence[int],
    cache: PromptCache,
    params: SamplingParams,
    block_size: Union[int, "AdaptiveBlockSize"],
    max_tokens: int,
    stop_tokens: frozenset = frozenset(),
    prefill_step_size: int = 2048,
    stream: "mx.Stream | mx.ThreadLocalStream | None" = None,
    *,
    seed: int | None = None,
    logprobs: int = 0,
) -> Generator[Block, None, None]:
    """Yield committed blocks of token ids; the first block is the prefill's token.

    `block_size` is a size or a policy with `next(limit)`/`observe(size, accepted,
    seconds)` and optionally `cut(confidences)`. `cache` is updated in place and stays
    consistent when the caller stops early; it belongs to this generation until it ends
    (another live one on it is refused). With a `seed`, each sampled token is the
    target's seeded draw at its position (see sampling.SeededNoise): the output depends
    on the seed and the prompt only, whatever the block sizes. Without one, the drafts
    are verified by rejection sampling with MLX's global generator (most accepted
    drafts). With `logprobs` k >= 1, each block carries the target's log-probabilities
    of its tokens and top k.
    """
    prompt = validate.token_ids(prompt, target.vocab_size)
    validate.max_tokens(max_tokens)
    validate.seed(seed)
    validate.logprobs(logprobs, target.vocab_size)
    validate.prefill_step_size(prefill_step_size)
    group = target.group
    if group is not None:  # a sharded target: every rank makes rank 0's choices
        from .lockstep import Lockstep, shared_seed

        if not isinstance(block_size, (int, FixedBlockSize)):
            block_size = cast(AdaptiveBlockSize, Lockstep(block_size, group))
        if seed is None and not params.greedy:
            seed = shared_seed(group)
    owner = object()
    cache.claim(owner)
    try:
        yield from _blocks(
            target,
            draft,
            prompt,
            cache,
            params,
            block_size,
            max_tokens,
            stop_tokens,
            prefill_step_size,
            stream,
            None if seed is None else SeededNoise(seed),
            logprobs,
        )
    finally:
        cache.release(owner)


def _blocks(
    target: Target,
    draft,
    prompt: Sequence[int],
    cache: PromptCache,
    params: SamplingParams,
    block_size,
    max_tokens: int,
    stop_tokens: frozenset,
    prefill_step_size: int,
    stream: "mx.Stream | mx.ThreadLocalStream | None",
    seeded: SeededNoise | None,
    top_logprobs: int,
) -> Generator[Block, None, None]:
    policy = FixedBlockSize(1) if draft is None else block_size
    if isinstance(policy, int):
        policy = FixedBlockSize(policy)
    run = _Run(target, draft, cache, params, policy, stop_tokens, seeded, top_logprobs)
    budget = max_tokens if max_tokens >= 0 else float("inf")
    stream = stream or mx.default_stream(mx.default_device())
    with mx.stream(stream):
        pending = run.prefill(prompt, prefill_step_size)
    n, last, step = 1, pending.tokens[0], None
    clock = time.perf_counter()
    try:
        while True:
            if not pending.finished and n < budget:
                with mx.stream(stream):
                    drafted = policy.next(limit=int(min(budget - n, 1 << 30)))
                    step = run.launch(last, drafted)
            handed_out = time.perf_counter()
            yield pending
            # the policy times this generation's own work: not the time the consumer
            # held the block (other generations may run on this thread meanwhile)
            away = time.perf_counter() - handed_out
            if step is None:
                return
            with mx.stream(stream):
                clock, pending = run.commit(step, last, budget - n, clock, away)
            last, n, step = pending.tokens[-1], n + len(pending.tokens), None
    finally:
        if step is not None:  # stopped with a block in flight: undo it entirely
            step.resolve()
            target.rollback(cache.target, step.tape or [], step.verified, 0)
        with mx.stream(stream):
            run.absorb()  # both caches cover the same tokens again


class _Run:
    """One generation's fixed parts, and its three moves: prefill, launch, commit."""

    def __init__(self, target, draft, cache, params, policy, stop_tokens, seeded, top):
        self.target, self.draft, self.cache, self.params = target, draft, cache, params
        self.policy, self.stop_tokens, self.seeded, self.top = (
            policy,
            stop_tokens,
            seeded,
            top,
        )
        self.mask_id = draft.args.mask_token_id if draft is not None else 0
        self.head = DraftHead.for_drafter(target, draft) if draft is not None else None
        self.keep_drafts = getattr(policy, "cut", None) if draft is not None else None
        # features of committed tokens the drafter has not absorbed yet (see `absorb`)
        self.unabsorbed: list[mx.array] = []

    def prefill(self, prompt: Sequence[int], step: int) -> Block:
        """Feed the prompt (after the cached prefix); the first token as a Block."""
        target, cache = self.target, self.cache
        reused = cache.reuse(target, prompt)
        logits = _prefill(target, self.draft, cache, list(prompt[reused:]), step)
        noise = None  # the first token's position: just after the prompt
        if self.seeded is not None and not self.params.greedy:
            noise = self.seeded.at(len(cache.tokens), 1, target.vocab_size)
        sampled = _accept(self.params, None, None, logits[None], noise)[1][0]
        rows = None
        if self.top > 0:
            rows = _logprob_rows(
                token_logprobs(logits[None], sampled[None], self.top), 1
            )
        first = cast(int, sampled.item())
        finished = first in self.stop_tokens
        return Block([first], 0, 1, finished, reused=reused, logprobs=rows)

    def absorb(self):
        """Feed the drafter the features of the tokens committed since it last drafted,
        in one forward: plain blocks leave it idle (a block of 1 costs what plain
        decoding does), and the next draft pays one absorb, not one per block."""
        if self.unabsorbed:
            features = mx.concatenate(self.unabsorbed, axis=1)
            self.draft.absorb(features, self.cache.draft)
            self.unabsorbed.clear()

    def launch(self, last: int, drafted: int) -> _Step:
        if drafted > 1:
            self.absorb()
        return _Step(
            self.target, self.draft, self.head, self.cache, last, drafted, self.params,
            self.mask_id, self.keep_drafts, self.seeded, self.top,
        )  # fmt: skip

    def commit(self, step: _Step, last: int, room, clock: float, away: float):
        """Sync `step`, tell the policy, keep what it committed: (now, its Block)."""
        accepted, tokens, rows = step.resolve()
        now = time.perf_counter()
        self.policy.observe(
            step.drafted,
            accepted,
            now - clock - away,
            verified=step.verified,
            verify_seconds=now - max(step.verify_start, clock) - away,
        )
        stops = (i + 1 for i, t in enumerate(tokens) if t in self.stop_tokens)
        stop_at = next(stops, len(tokens))
        tokens = tokens[: int(min(stop_at, room))]
        rows = rows[: len(tokens)] if rows is not None else None
        cache = self.cache
        if self.draft is not None:
            self.unabsorbed.append(step.features[:, : len(tokens)])
            if len(self.unabsorbed) >= MAX_UNABSORBED:  # a long plain run: bound it
                self.absorb()
                mx.async_eval([c.state for c in cache.draft])
        self.target.rollback(cache.target, step.tape or [], step.verified, len(tokens))
        cache.tokens.append(last)
        cache.tokens.extend(tokens[:-1])
        finished = tokens[-1] in self.stop_tokens
        from_draft = min(accepted, len(tokens))
        return now, Block(tokens, from_draft, step.verified, finished, logprobs=rows)
