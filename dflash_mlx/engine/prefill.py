"""A prompt into the caches, and the first token after it: the part of a generation
before any block is verified (engine/loop.py runs it for one sequence; the server
runs it in chunks, one sequence at a time, between the batch's steps)."""

from collections.abc import Callable, Sequence

import mlx.core as mx

from ..models.cache import PromptCache
from ..models.target import Target
from ..sampling import SamplingParams, SeededNoise, token_logprobs
from .processors import Processors
from .step import TokenLogprobs, accept, logprob_rows


def prefill(
    target: Target,
    draft,
    cache: PromptCache,
    ids: list[int],
    step: int,
    progress: Callable[[int, int], None] | None = None,
) -> mx.array:
    """Feed `ids` through the target (and their features to the drafter), `step`
    tokens a forward; the last position's logits.

    The drafter takes in only the positions its layers can read from the end of
    `ids` (`draft.reach()`): on a long prompt its cost stops growing with the
    prompt, and after every call its context is what a full absorb would leave (a
    server prefilling chunk by chunk keeps that at every chunk's end).
    `progress(done, total)` (mlx-lm's `prompt_progress_callback`) hears of each chunk,
    counting the positions the cache held before as done."""
    reach = None if draft is None else draft.reach()
    read_from = 0 if reach is None else len(ids) - reach
    held = len(cache.tokens)
    start = 0
    while start < len(ids):
        if progress is not None:
            progress(held + start, held + len(ids))
        n = chunk_size(target, cache, step, held + start)
        chunk = mx.array(ids[start : start + n])[None]
        hidden, features = target(chunk, cache.target)
        if draft is not None:
            _absorb(draft, cache.draft, features, read_from - start)
        start += n
        if start < len(ids):
            mx.eval([c.state for c in cache.target + (cache.draft or [])])
            mx.clear_cache()
    cache.tokens.extend(ids)
    logits = target.logits(hidden[:, -1])[0]
    if progress is not None:
        mx.eval(logits)
        progress(held + len(ids), held + len(ids))
    return logits


# Where a chunk's attention materializes its scores against the whole context, chunks
# shrink as the context grows so that these stay near this size: at 32K tokens a
# 2048-token chunk's scores are 2048 x 32K x 4 bytes a head, gigabytes on any model.
SCORES_BYTES = 1 << 27
MIN_CHUNK = 128


def chunk_size(target: Target, cache: PromptCache, step: int, context: int) -> int:
    """Prompt tokens for the next forward at `context` cached positions."""
    if not materializes_scores(target, cache):
        return step
    per_query = 4 * target.query_heads * (context + step)
    return max(min(step, MIN_CHUNK), min(step, SCORES_BYTES // per_query))


def materializes_scores(target: Target, cache: PromptCache) -> bool:
    """Whether a prefill chunk's attention writes out its chunk x context scores:
    mlx-lm's quantized attention does on every device (two quantized matmuls), and
    MLX's fused attention does on the CPU backend (its fallback), where the CPU's
    native blocks (cpu/blocks.py) tile it instead. On a Mac's GPU a float cache's
    prefill runs MLX's fused kernel and keeps the chunk asked for."""
    if cache.kv_bits is not None:
        return True
    return not target.cpu_blocks and mx.default_device() == mx.cpu


def _absorb(draft, cache, features: mx.array, unread: int):
    """The drafter takes in a chunk's features but for its first `unread`
    positions, which no layer will read."""
    unread = min(max(unread, 0), features.shape[1])
    if not all(hasattr(c, "skip") for c in cache):  # a cache made with no window
        unread = 0
    if unread:
        draft.skip(unread, cache)
    if unread < features.shape[1]:
        draft.absorb(features[:, unread:], cache)


def first_token(
    target: Target,
    params: SamplingParams,
    seeded: SeededNoise | None,
    logits: mx.array,
    position: int,
    top: int = 0,
    processors: Processors | None = None,
    prompt: Sequence[int] = (),
) -> tuple[int, list[TokenLogprobs] | None]:
    """The token after the prompt (at `position`) from its logits, drawn as the
    engine draws every token, and its logprob rows when `top` > 0 (one sync);
    `processors` see the `prompt`'s ids."""
    noise = None
    if seeded is not None and not params.greedy:
        noise = seeded.at(position, 1, target.vocab_size)
    processed = logits[None]
    if processors is not None:
        processed = processors.apply(prompt, None, processed)
    sampled = accept(params, None, None, processed, noise)[1][0]
    rows = None
    if top > 0:
        rows = logprob_rows(token_logprobs(logits[None], sampled[None], top), 1)
    return int(sampled.item()), rows
