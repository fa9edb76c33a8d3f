"""Speculative decoding with a DFlash drafter: a token-level engine and the
`stream_generate` / `generate` API on top of it (drop-in for `dflash.model_mlx`).

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
"""

import time
import warnings
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, field
from typing import Union, cast

import mlx.core as mx

from . import validate
from .adaptive import AdaptiveBlockSize, FixedBlockSize
from .cache import PromptCache
from .draft_head import DraftHead
from .target import Target
from .verify import (
    KeyStream,
    SamplingParams,
    accept_greedy,
    accept_sampled,
    token_logprobs,
)

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


def _as_target(model, draft) -> Target:
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
    key: mx.array | None,
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
    tokens, q = draft.propose(h, logits, block[0, 0], params, key)
    probs = q if q is not None else draft.kernels.softmax(logits)
    confidence = probs.max(axis=-1)
    return (*head.to_target(tokens, q), confidence)


def _accept(params: SamplingParams, drafts, draft_probs, logits: mx.array, key):
    """(accepted, emitted) for the verified drafts (None: no drafts, plain decoding)."""
    if drafts is None:
        return mx.array(0), params.sample(logits, key)
    if params.greedy:
        return accept_greedy(drafts, logits)
    if draft_probs is None:
        raise ValueError("The drafter sampled its proposals without returning their q.")
    return accept_sampled(drafts, draft_probs, params.probs(logits), key)


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
        keys: KeyStream | None = None,
        top_logprobs: int = 0,
    ):
        self.drafted = drafted
        greedy = params.greedy
        self.tape: list | None = [] if target.recurrent else None
        block = mx.array([[last] + [mask_id] * (drafted - 1)])
        drafts = draft_probs = None
        if drafted > 1 and head is not None:
            key = None if greedy or keys is None else keys.take()
            drafts, draft_probs, confidence = _draft(
                target, draft, head, cache, block, params, key
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
        key = None if greedy or keys is None else keys.take()
        accepted, emitted = _accept(params, drafts, draft_probs, logits, key)
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
    (another live one on it is refused). With a `seed`, sampling draws from this
    generation's own keys only. With `logprobs` k >= 1, each block carries the target's
    log-probabilities of its tokens and top k.
    """
    prompt = validate.token_ids(prompt, target.vocab_size)
    validate.max_tokens(max_tokens)
    validate.seed(seed)
    validate.logprobs(logprobs, target.vocab_size)
    validate.prefill_step_size(prefill_step_size)
    group = target.group
    if group is not None:  # a sharded target: every rank makes rank 0's choices
        from .distributed import Lockstep, shared_seed

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
            KeyStream(seed),
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
    keys: KeyStream,
    top_logprobs: int,
) -> Generator[Block, None, None]:
    policy = FixedBlockSize(1) if draft is None else block_size
    if isinstance(policy, int):
        policy = FixedBlockSize(policy)
    stream = stream or mx.default_stream(mx.default_device())
    mask_id = draft.args.mask_token_id if draft is not None else 0
    head = DraftHead.for_drafter(target, draft) if draft is not None else None
    keep_drafts = getattr(policy, "cut", None) if draft is not None else None
    budget = max_tokens if max_tokens >= 0 else float("inf")
    reused = cache.reuse(target, prompt)
    with mx.stream(stream):
        logits = _prefill(
            target, draft, cache, list(prompt[reused:]), prefill_step_size
        )
        sampled = params.sample(logits, None if params.greedy else keys.take())
        rows = None
        if top_logprobs > 0:
            rows = _logprob_rows(
                token_logprobs(logits[None], sampled[None], top_logprobs), 1
            )
        first = cast(int, sampled.item())
    n, last = 1, first
    done = first in stop_tokens or n >= budget
    pending = Block([first], 0, 1, first in stop_tokens, reused=reused, logprobs=rows)
    step = None
    clock = time.perf_counter()
    try:
        while True:
            if not done:
                with mx.stream(stream):
                    drafted = policy.next(limit=int(min(budget - n, 1 << 30)))
                    step = _Step(
                        target,
                        draft,
                        head,
                        cache,
                        last,
                        drafted,
                        params,
                        mask_id,
                        keep_drafts,
                        keys,
                        top_logprobs,
                    )
            handed_out = time.perf_counter()
            yield pending
            # the policy times this generation's own work: not the time the consumer
            # held the block (other generations may run on this thread meanwhile)
            away = time.perf_counter() - handed_out
            if step is None:
                return
            accepted, tokens, rows = step.resolve()
            now = time.perf_counter()
            policy.observe(
                step.drafted,
                accepted,
                now - clock - away,
                verified=step.verified,
                verify_seconds=now - max(step.verify_start, clock) - away,
            )
            clock = now
            stop_at = next(
                (i + 1 for i, t in enumerate(tokens) if t in stop_tokens), len(tokens)
            )
            tokens = tokens[: int(min(stop_at, budget - n))]
            rows = rows[: len(tokens)] if rows is not None else None
            with mx.stream(stream):
                if draft is not None:
                    draft.absorb(step.features[:, : len(tokens)], cache.draft)
                target.rollback(
                    cache.target, step.tape or [], step.verified, len(tokens)
                )
            cache.tokens.append(last)
            cache.tokens.extend(tokens[:-1])
            last, n = tokens[-1], n + len(tokens)
            finished = tokens[-1] in stop_tokens
            done = finished or n >= budget
            from_draft = min(accepted, len(tokens))
            pending = Block(tokens, from_draft, step.verified, finished, logprobs=rows)
            step = None
    finally:
        if step is not None:  # stopped with a block in flight: undo it entirely
            step.resolve()
            target.rollback(cache.target, step.tape or [], step.verified, 0)


@dataclass
class GenerationResponse:
    """One verified block as text and numbers (the fields of `dflash.model_mlx` and
    mlx-lm)."""

    text: str
    tokens: list[int]
    # tokens this block committed (the acceptance length), None for the first
    accepted: int | None
    prompt_tokens: int
    prompt_tps: float
    generation_tokens: int
    generation_tps: float
    peak_memory: float  # GB
    finish_reason: str | None = None
    from_draft: int = 0  # leading tokens of `tokens` that were drafted
    block_size: int = 1  # tokens the target verified for this block
    reused_tokens: int = 0  # prompt tokens served from the prompt cache
    # per token, with stream_generate(logprobs=k)
    logprobs: list[TokenLogprobs] | None = None
    # the text of each of `tokens` (a stop token's is ''); joined, they are `text`
    token_texts: list[str] = field(default_factory=list)

    @property
    def token(self) -> int | None:
        return self.tokens[-1] if self.tokens else None


def _block_policy(block_size, draft):
    """None: the drafter's block size; "auto": adaptive up to it; an int: that size."""
    largest = draft.args.block_size if draft is not None else 1
    if block_size is None:
        return FixedBlockSize(largest)
    if block_size == "auto":
        return AdaptiveBlockSize(largest)
    if hasattr(block_size, "next") and hasattr(block_size, "observe"):
        return block_size  # a policy: AdaptiveBlockSize, FixedBlockSize or your own
    size, note = validate.block_size(block_size, largest if draft else None)
    if note:
        warnings.warn(note, UserWarning, stacklevel=3)
    return FixedBlockSize(size)


def wrap_tokenizer(tokenizer):
    """`tokenizer` as mlx-lm's `TokenizerWrapper` (streaming detokenizer, EOS ids)."""
    from mlx_lm.tokenizer_utils import TokenizerWrapper

    return (
        tokenizer
        if isinstance(tokenizer, TokenizerWrapper)
        else TokenizerWrapper(tokenizer)
    )


def encode_prompt(tokenizer, prompt: str | list | mx.array) -> list[int]:
    """Text through the tokenizer; ids (a list or a 1-D array) checked as ints."""
    if isinstance(prompt, str):
        bos = tokenizer.bos_token
        return tokenizer.encode(
            validate.text(prompt),
            add_special_tokens=bos is None or not prompt.startswith(bos),
        )
    return validate.token_ids(prompt)


_EMPTY_IDS = "The prompt is empty: give at least one token."
_EMPTY_TEXT = (
    "The prompt encodes to no tokens: give some text (if it is not empty, the "
    "tokenizer may be missing: check the model folder's tokenizer files)."
)


def stream_generate(
    model,
    draft,
    tokenizer,
    prompt: str | list[int] | mx.array,
    block_size: int | str | None = None,
    max_tokens: int = 256,
    temperature: float = 0.0,
    top_p: float = 1.0,
    top_k: int = 0,
    prefill_step_size: int = 2048,
    *,
    min_p: float = 0.0,
    prompt_cache: PromptCache | None = None,
    seed: int | None = None,
    logprobs: int = 0,
) -> Generator[GenerationResponse, None, None]:
    """Generate from `prompt`, yielding one response per verified block.

    `block_size`: None for the drafter's, an int, or "auto" to pick, as it goes, the
    size with the most tokens per second on this machine (1 = plain decoding when
    drafting does not pay). `draft=None` or `block_size=1` decodes without speculation.
    Pass a `PromptCache` (from `make_prompt_cache`) to reuse the caches of earlier calls
    (multi-turn chat). Sampling follows `mlx_lm.sample_utils.make_sampler`: top-p,
    min-p and top-k filter the distribution at temperature 1, then the temperature
    applies; 0 turns each filter off.
    `seed`: sample from this generation's own random keys (same seed, same output).
    `logprobs` k >= 1: each response carries, per token, the target's log-probability of
    it and its k most likely tokens.
    """
    from mlx_lm.generate import generation_stream, wired_limit

    validate.max_tokens(max_tokens)
    params = SamplingParams(temperature, top_p, top_k, min_p)
    policy = _block_policy(block_size, draft)
    if draft is not None:
        from .loading import check_compatible

        check_compatible(model, draft)
    target = _as_target(model, draft)
    tokenizer = wrap_tokenizer(tokenizer)
    ids = encode_prompt(tokenizer, prompt)
    if not ids:
        raise ValueError(_EMPTY_TEXT if prompt else _EMPTY_IDS)
    if prompt_cache is None:
        prompt_cache = PromptCache(target, draft)
    elif not prompt_cache.fits(target, draft):
        raise ValueError(
            "This prompt_cache belongs to another model/drafter pair: make a new one."
        )
    detokenizer = tokenizer.detokenizer
    stop = frozenset(tokenizer.eos_token_ids)

    with wired_limit(target.model, [generation_stream]):
        tic = time.perf_counter()
        blocks = generate_blocks(
            target,
            draft,
            ids,
            prompt_cache,
            params,
            policy,
            max_tokens,
            stop,
            prefill_step_size,
            generation_stream,
            seed=seed,
            logprobs=logprobs,
        )
        try:
            yield from _responses(blocks, ids, max_tokens, detokenizer, tic)
        finally:
            blocks.close()  # roll back a block still in flight, now rather than at GC


def _token_texts(block: Block, detokenizer, last: bool) -> list[str]:
    """Each token's text (the stop token shows none); flushed at the last block."""
    shown = block.tokens[:-1] if block.finished else block.tokens
    texts = []
    for t in shown:
        detokenizer.add_token(t)
        texts.append(detokenizer.last_segment)
    if block.finished:
        texts.append("")
    if last:
        detokenizer.finalize()
        texts[max(len(shown) - 1, 0)] += detokenizer.last_segment
    return texts


def _responses(blocks, ids, max_tokens, detokenizer, tic):
    """Turn committed blocks into `GenerationResponse`s (text, timing, memory)."""
    n, prompt_tps, reused = 0, 0.0, 0
    for i, block in enumerate(blocks):
        if i == 0:
            reused = block.reused
            prompt_tps = (len(ids) - reused) / max(time.perf_counter() - tic, 1e-9)
            tic = time.perf_counter()
        n += len(block.tokens)
        last = block.finished or 0 <= max_tokens <= n
        texts = _token_texts(block, detokenizer, last)
        yield GenerationResponse(
            text="".join(texts),
            tokens=block.tokens,
            accepted=len(block.tokens) if i else None,
            prompt_tokens=len(ids),
            prompt_tps=prompt_tps,
            generation_tokens=n,
            generation_tps=n / max(time.perf_counter() - tic, 1e-9),
            peak_memory=mx.get_peak_memory() / 1e9,
            finish_reason=("stop" if block.finished else "length") if last else None,
            from_draft=block.from_draft,
            block_size=block.block_size,
            reused_tokens=reused,
            logprobs=block.logprobs,
            token_texts=texts,
        )


def generate(model, draft, tokenizer, prompt, verbose: bool = False, **kwargs) -> str:
    """Generate a complete answer; same arguments as `stream_generate`."""
    text = ""
    for response in stream_generate(model, draft, tokenizer, prompt, **kwargs):
        text += response.text
        if verbose:
            print(response.text, end="", flush=True)
    if verbose:
        print()
    return text


def make_prompt_cache(model, draft=None) -> PromptCache:
    """Caches to pass to `stream_generate(prompt_cache=...)` across calls."""
    return PromptCache(_as_target(model, draft), draft)
