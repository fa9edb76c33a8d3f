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
  verify, from the drafter's confidences; it costs a second sync per block, so it is
  asked only where the policy's `cut_may_drop` says verifying fewer can pay.
- `verified`: tokens the target verifies, `last` and the drafts kept (1 + kept).
- `accepted`: drafts the target accepted; it commits them plus one token of its own.
- `stop_at`: how many committed tokens to keep, up to and with the first stop token.
- `reused`: prompt tokens the cache already held.
- `unabsorbed`: features of committed tokens the drafter has not taken in yet; it takes
  them in before its next draft, so blocks of 1 and lookup blocks leave it idle.
- `copy`: prompt lookup's proposal (lookup.py), ids that followed the history's last
  n-gram where it occurred before; `plan`: the policy's choice of source for a block
  (sources.py: the drafter's block, the copy, or a splice of the copy and the drafts).
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
from ..sampling import SamplingParams, SeededNoise, token_logprobs
from .lookup import LookupIndex
from .policy import MAX_LOOKUP, AdaptiveBlockSize, FixedBlockSize
from .prefill import prefill
from .processors import Processors
from .sources import DRAFT, LOOKUP, Plan
from .step import Step, TokenLogprobs, accept, logprob_rows

# Blocks whose features may wait for the drafter's next draft (memory stays bounded
# through a long run of plain blocks; 16 tokens are one native product).
MAX_UNABSORBED = 16


@dataclass
class Block:
    """Tokens committed by one verify step."""

    tokens: list[int]
    from_draft: int  # how many of `tokens` (a prefix) were proposals (drafts, copies)
    block_size: int  # tokens the target verified in this step (`verified`)
    finished: bool = False  # ended on a stop token
    reused: int = 0  # prompt tokens served from the cache (first block only)
    logprobs: list[TokenLogprobs] | None = None  # one per token, when asked for
    # what proposed the verified tokens: "draft", "lookup" or "splice" (the copy, then
    # the drafter's drafts); None when nothing was (plain decoding, the prefill token)
    source: str | None = None


def as_target(model, draft) -> Target:
    if isinstance(model, Target):
        return model
    ids = draft.args.target_layer_ids if draft is not None else ()
    return Target(model, ids)


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
    lookup: LookupIndex | None = None,
    prompt_progress_callback: Callable[[int, int], None] | None = None,
    logits_processors=None,
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
    of its tokens and top k. With `lookup` (a `LookupIndex`, synced here with the prompt
    and extended with each committed token), a policy with `plan` may verify copies
    from the history instead of, or ahead of, the drafter's drafts. With
    `logits_processors` (mlx-lm's `(tokens, logits) -> logits`), the target's logits at
    every verified position are processed with the history up to it first
    (processors.py): the output is plain decoding's with the same processors.
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
    processors = Processors.of(logits_processors)
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
            lookup,
            prompt_progress_callback,
            processors,
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
    lookup: LookupIndex | None,
    progress: Callable[[int, int], None] | None,
    processors: Processors | None = None,
) -> Generator[Block, None, None]:
    policy = FixedBlockSize(1) if draft is None and lookup is None else block_size
    if isinstance(policy, int):
        policy = FixedBlockSize(policy)
    run = _Run(target, draft, cache, params, policy, stop_tokens, seeded, top_logprobs)
    run.lookup, run.plan = lookup, getattr(policy, "plan", None)
    run.progress = progress
    run.processors = processors
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
                    step = run.launch(last, int(min(budget - n, 1 << 30)))
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
        # whether a cut is worth its sync at a size (a policy without it: always)
        self.may_cut = getattr(policy, "cut_may_drop", lambda size: True)
        # features of committed tokens the drafter has not absorbed yet (see `absorb`)
        self.unabsorbed: list[mx.array] = []
        self.lookup: LookupIndex | None = None  # the history's index, when copying
        self.plan = None  # the policy's `plan`, where it has one
        self.progress = None  # the prefill's progress callback (done, total)
        self.processors: Processors | None = None  # logits processors, if any

    def prefill(self, prompt: Sequence[int], step: int) -> Block:
        """Feed the prompt (after the cached prefix); the first token as a Block."""
        target, cache = self.target, self.cache
        reused = cache.reuse(target, prompt)
        new = list(prompt[reused:])
        logits = prefill(target, self.draft, cache, new, step, self.progress)
        noise = None  # the first token's position: just after the prompt
        if self.seeded is not None and not self.params.greedy:
            noise = self.seeded.at(len(cache.tokens), 1, target.vocab_size)
        processed = logits[None]
        if self.processors is not None:
            processed = self.processors.apply(cache.tokens, None, processed)
        sampled = accept(self.params, None, None, processed, noise)[1][0]
        rows = None
        if self.top > 0:
            rows = logprob_rows(
                token_logprobs(logits[None], sampled[None], self.top), 1
            )
        first = cast(int, sampled.item())
        finished = first in self.stop_tokens
        if self.lookup is not None:
            self.lookup.sync(prompt)
            self.lookup.extend([first])
        return Block([first], 0, 1, finished, reused=reused, logprobs=rows)

    def absorb(self):
        """Feed the drafter the features of the tokens committed since it last drafted,
        in one forward: plain blocks leave it idle (a block of 1 costs what plain
        decoding does), and the next draft pays one absorb, not one per block."""
        if self.unabsorbed:
            features = mx.concatenate(self.unabsorbed, axis=1)
            self.draft.absorb(features, self.cache.draft)
            self.unabsorbed.clear()

    def launch(self, last: int, limit: int) -> Step:
        """Plan the next block (at most `limit` tokens) and start it."""
        plan, copy = self._plan(limit)
        if plan.source != LOOKUP and plan.size > 1 and self.draft is not None:
            self.absorb()
        step = Step(self, last, plan, copy)
        step.match = self.lookup.match if copy and self.lookup is not None else 0
        return step

    def _plan(self, limit: int) -> tuple[Plan, list[int]]:
        """The policy's plan, and lookup's copy when there is one: without one (or
        without lookup) the policy's `next`, as plain DFlash asks it."""
        index, copy = self.lookup, []
        if index is not None and self.plan is not None and limit > 1:
            cap = getattr(self.policy, "max_lookup", MAX_LOOKUP)
            copy = index.propose(min(cap, limit - 1))
        if not copy:
            return Plan(DRAFT, self.policy.next(limit=limit)), []
        assert index is not None and self.plan is not None
        return self.plan(limit, len(copy), index.match, self.draft is not None), copy

    def commit(self, step: Step, last: int, room, clock: float, away: float):
        """Sync `step`, tell the policy, keep what it committed: (now, its Block)."""
        accepted, tokens, rows = step.resolve()
        now = time.perf_counter()
        plan, extra = step.plan, {}
        if plan.source != DRAFT:  # a policy that plans hears which source it chose
            extra = dict(source=plan.source, match=step.match, copied=plan.copied)
        self.policy.observe(
            step.drafted,
            accepted,
            now - clock - away,
            verified=step.verified,
            verify_seconds=now - max(step.verify_start, clock) - away,
            **extra,
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
        if self.lookup is not None:
            self.lookup.extend(tokens)
        block = Block(tokens, from_draft, step.verified, finished, logprobs=rows)
        block.source = step.source
        return now, block
