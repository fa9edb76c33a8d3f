"""One block in flight: its proposals (the drafter's, a lookup copy, or a splice of
both), the target's verify forward and the acceptance rule, built as one lazy graph.

The loop (loop.py) launches a `Step` with the policy's `Plan` and resolves it one block
later; the words are the loop's (`last`, `drafted`, `verified`, `accepted`).
"""

import time
from typing import cast

import mlx.core as mx

from ..models.draft_head import DraftHead
from ..models.target import Target
from ..sampling import SamplingParams, perturbed, token_logprobs
from .processors import proposing
from .sources import DRAFT, LOOKUP, SPLICE, Plan
from .verify import (
    accept_greedy,
    accept_lookup,
    accept_sampled,
    greedy_result,
    one_hot,
)

# One committed token's log-probability under the target, and its top (id, logprob)s.
TokenLogprobs = tuple[float, list[tuple[int, float]]]


def draft_block(
    target: Target,
    draft,
    head: DraftHead,
    cache,
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


def accept(
    params: SamplingParams,
    drafts,
    draft_probs,
    logits: mx.array,
    noise,
    copied: bool = False,
):
    """(accepted, emitted) for the verified drafts (None: no drafts, plain decoding);
    `copied`: the drafts are a lookup copy (deterministic, no q).

    With a seeded generation's `noise`, the target's draw at each position is the argmax
    of its perturbed log-probabilities: drafts are accepted while they equal it, whoever
    proposed them."""
    if noise is not None:
        logits = perturbed(params.probs(logits), noise[: logits.shape[0]])
    if drafts is None:
        emitted = mx.argmax(logits, -1) if noise is not None else params.sample(logits)
        return mx.array(0), emitted
    if params.greedy or noise is not None:
        return accept_greedy(drafts, logits)
    if copied:
        return accept_lookup(drafts, params.probs(logits))
    if draft_probs is None:
        raise ValueError("The drafter sampled its proposals without returning their q.")
    return accept_sampled(drafts, draft_probs, params.probs(logits))


class Step:
    """One planned block in flight (lazy until `resolve`).

    `run` holds the generation's fixed parts (target, draft, head, cache, params,
    mask_id, keep_drafts, may_cut, seeded, top, processors). A drafter block may be cut
    (`keep_drafts`, the adaptive policy's `cut`): its drafts are evaluated first and
    only the prefix chosen from the drafter's confidences is verified, a second sync
    per block paid back where verifying fewer tokens is cheaper (CPUs); where the
    verify cost is flat (`may_cut` says no) every draft is verified, one sync. A lookup
    block verifies its copy with no drafter forward; a splice verifies the copy then
    the drafter's drafts after it, uncut. None of these choices looks at a drawn
    token, so output stays exact.
    """

    def __init__(self, run, last: int, plan: Plan, copy: list[int]):
        target, cache, params = run.target, run.cache, run.params
        self.plan, self.drafted = plan, plan.size
        self.match = 0  # the n-gram the copy matched (set by the loop)
        noise = None  # the positions after `last`: drafts, then the target's rows
        if run.seeded is not None and not params.greedy:
            noise = run.seeded.at(len(cache.tokens) + 1, plan.size, target.vocab_size)
        self.tape: list | None = [] if target.recurrent else None
        drafts, draft_probs = _proposals(run, last, plan, copy, noise)
        self.verify_start = time.perf_counter()
        first = mx.array([last])
        if drafts is not None and drafts.shape[0] > 0:
            verify_ids = mx.concatenate([first, drafts.astype(first.dtype)])[None]
        else:
            drafts, verify_ids = None, first[None]
        self.verified = verify_ids.shape[1]
        hidden, self.features = target(verify_ids, cache.target, self.tape)
        raw = logits = target.logits(hidden)[0]
        if run.processors is not None:  # the target verifies while they run
            mx.async_eval(logits)
            logits = run.processors.apply(cache.tokens, last, logits, drafts)
        if drafts is not None and params.greedy:
            self.result = greedy_result(drafts, logits)
            emitted = self.result[1:]
        else:
            copied = plan.source == LOOKUP
            accepted, emitted = accept(
                params, drafts, draft_probs, logits, noise, copied
            )
            count = accepted[None].astype(emitted.dtype)
            self.result = mx.concatenate([count, emitted])
        self.logprobs = None
        if run.top > 0:
            self.logprobs = token_logprobs(raw, emitted, run.top)
        mx.async_eval(self.result, *(self.logprobs or ()))

    @property
    def source(self) -> str | None:
        """Where the verified proposals came from; None when none was verified."""
        return self.plan.name if self.verified > 1 else None

    def resolve(self) -> tuple[int, list[int], list[TokenLogprobs] | None]:
        """Sync: (drafts accepted, committed tokens, their logprobs or None)."""
        values = cast(list[int], self.result.tolist())
        n = values[0] + 1
        return values[0], values[1 : n + 1], logprob_rows(self.logprobs, n)


def _proposals(run, last: int, plan: Plan, copy: list[int], noise):
    """(drafts, their q or None) to verify after `last`, as `plan` says."""
    if plan.source == LOOKUP:
        return _shaped(run, last, mx.array(copy[: plan.copied]), None)
    if plan.size < 2 or run.head is None:
        return None, None
    block = mx.array([[last] + [run.mask_id] * (plan.size - 1)])
    drafts, q, confidence = draft_block(
        run.target, run.draft, run.head, run.cache, block, run.params, noise
    )
    if plan.source == SPLICE:  # the copy, then the drafter's drafts after it
        head = mx.array(copy[: plan.copied])
        drafts = mx.concatenate([head.astype(drafts.dtype), drafts[plan.copied :]])
        if q is not None:
            q = mx.concatenate([one_hot(head, q.shape[-1]), q[plan.copied :]])
        return _shaped(run, last, drafts, q)
    assert plan.source == DRAFT
    kept = None
    if run.keep_drafts is not None and run.may_cut(plan.size):
        mx.eval(drafts, confidence, q)
        kept = run.keep_drafts(confidence.tolist())
    return _shaped(run, last, drafts, q, kept)


def _shaped(run, last: int, drafts: mx.array, q, kept: int | None = None):
    """The first `kept` drafts (all without), as a grammar shapes them where one runs
    (processors.Processors.propose): its chosen tokens in place, q one-hot there, and
    the drafts past `kept` it chose verified too. Deterministic drafts end before the
    first it forbids; sampled ones do not, as a cut that read a drawn token would
    skew the residual draw (each other choice reads only the tokens before it)."""
    n = drafts.shape[0]
    kept = n if kept is None else kept
    if not proposing(run.processors) or n == 0:
        if kept < n:  # the policy's cut
            drafts, q = drafts[:kept], None if q is None else q[:kept]
        return drafts, q
    before = cast(list[int], drafts.tolist())  # a sync the grammar's mask makes anyway
    after, chosen, q = run.processors.shape(run.cache.tokens, last, before, q)
    length = kept
    while length < len(chosen) and chosen[length]:
        length += 1
    if q is None:
        length = min(length, len(chosen))
    return mx.array(after[:length], drafts.dtype), None if q is None else q[:length]


def logprob_rows(arrays, n: int) -> list[TokenLogprobs] | None:
    """The first `n` rows of `token_logprobs`' arrays as Python values."""
    if arrays is None:
        return None
    chosen, ids, values = (a[:n].tolist() for a in arrays)
    rows = zip(chosen, ids, values, strict=True)
    return [(c, list(zip(i, v, strict=True))) for c, i, v in rows]
