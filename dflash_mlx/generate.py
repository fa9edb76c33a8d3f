"""`stream_generate` / `generate`: the text API over the engine (drop-in for
`dflash.model_mlx`), with responses as mlx-lm shapes them."""

import time
import warnings
from collections.abc import Callable, Generator
from dataclasses import dataclass, field

import mlx.core as mx

from . import validate
from .engine.lookup import LookupIndex
from .engine.loop import Block, TokenLogprobs, as_target, generate_blocks
from .engine.policy import AdaptiveBlockSize, FixedBlockSize
from .models.cache import PromptCache
from .sampling import SamplingParams
from .structured import DEAD_END


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
    from_draft: int = 0  # leading tokens of `tokens` that were proposed (drafted or
    # copied) and accepted
    block_size: int = 1  # tokens the target verified for this block
    reused_tokens: int = 0  # prompt tokens served from the prompt cache
    # per token, with stream_generate(logprobs=k)
    logprobs: list[TokenLogprobs] | None = None
    # the text of each of `tokens` (a stop token's is ''); joined, they are `text`
    token_texts: list[str] = field(default_factory=list)
    # what proposed this block's verified tokens: "draft" (the drafter), "lookup" (a
    # copy from the prompt or answer), "splice" (a copy, then drafts); None for plain
    # decoding and the first token
    source: str | None = None

    @property
    def token(self) -> int | None:
        return self.tokens[-1] if self.tokens else None


def _block_policy(block_size, draft, lookup=None):
    """None: the drafter's block size; "auto": adaptive up to it; an int: that size.
    Without a drafter but with lookup, None is "auto" (plain decoding or a copy)."""
    largest = draft.args.block_size if draft is not None else 1
    if block_size is None and draft is None and lookup not in (None, False):
        return AdaptiveBlockSize(1)
    if block_size is None:
        return FixedBlockSize(largest)
    if block_size == "auto":
        if draft is None:
            return AdaptiveBlockSize(1)
        return AdaptiveBlockSize.for_drafter(draft)
    if hasattr(block_size, "next") and hasattr(block_size, "observe"):
        return block_size  # a policy: AdaptiveBlockSize, FixedBlockSize or your own
    size, note = validate.block_size(block_size, largest if draft else None)
    if note:
        warnings.warn(note, UserWarning, stacklevel=3)
    return FixedBlockSize(size)


def lookup_index(lookup, policy, draft) -> LookupIndex | None:
    """The index prompt lookup copies from, or None for no lookup.

    None (the default): on where the policy weighs it block by block against the
    drafter (an adaptive policy with a drafter), so it never costs more than a few
    blocks; off for fixed block sizes and plain decoding. True: on (a fresh index of
    the prompt). A `LookupIndex`: on, with that index (a chat keeps one across turns,
    so the whole conversation is indexed once)."""
    if lookup is None:
        on = draft is not None and isinstance(policy, AdaptiveBlockSize)
        return LookupIndex() if on else None
    if isinstance(lookup, LookupIndex):
        return lookup
    if lookup is True:
        return LookupIndex()
    if lookup is False:
        return None
    raise ValueError(
        f"lookup must be True, False, None (automatic) or a LookupIndex, got "
        f"{lookup!r}."
    )


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
    lookup: "bool | LookupIndex | None" = None,
    kv_bits: int | None = None,
    kv_group_size: int = 64,
    prompt_progress_callback: Callable[[int, int], None] | None = None,
    logits_processors: list | None = None,
) -> Generator[GenerationResponse, None, None]:
    """Generate from `prompt`, yielding one response per verified block.

    `block_size`: None for the drafter's, an int, or "auto" to pick, as it goes, the
    size with the most tokens per second on this machine (1 = plain decoding when
    drafting does not pay). `draft=None` or `block_size=1` decodes without speculation.
    Pass a `PromptCache` (from `make_prompt_cache`) to reuse the caches of earlier calls
    (multi-turn chat). Sampling follows `mlx_lm.sample_utils.make_sampler`: top-p,
    min-p and top-k filter the distribution at temperature 1, then the temperature
    applies; 0 turns each filter off.
    `seed`: same seed and prompt, same output, whatever the block sizes (each token is
    the target's seeded draw at its position; without a seed, rejection sampling).
    `logprobs` k >= 1: each response carries, per token, the target's log-probability of
    it and its k most likely tokens.
    `lookup`: prompt lookup, proposals copied from the prompt and the answer so far
    where the text repeats (see `lookup_index`: by default on with "auto", which
    verifies a copy only where it beats the drafter's block); each response's `source`
    says what proposed its tokens.
    `kv_bits` (2, 3, 4, 5, 6 or 8) quantizes the target's attention KV cache from the
    first prompt token on, in groups of `kv_group_size` (32, 64 or 128) along the head
    dimension, as mlx-lm's `QuantizedKVCache` (greedy output equals plain decoding with
    the same quantized cache); a `prompt_cache` keeps the quantization it was made with.
    `prompt_progress_callback(done, total)`, as mlx-lm's: prompt tokens processed so
    far (the reused prefix counts as done), at the start and after each prefill chunk.
    `logits_processors`: mlx-lm's `(tokens, logits) -> logits` callables (e.g.
    `mlx_lm.sample_utils.make_logits_processors`, or `structured.grammar_processor`),
    applied to the target's logits at every verified position with the history up to
    it (prompt included, as mlx-lm): greedy output equals mlx-lm's plain decoding with
    the same processors, sampled output keeps its distribution. Logprobs stay the raw
    model's. A stateful processor (a grammar) serves one generation: make a new one
    for each call.
    """
    from mlx_lm.generate import generation_stream, wired_limit

    validate.max_tokens(max_tokens)
    kv = validate.kv_quantization(kv_bits, kv_group_size)
    params = SamplingParams(temperature, top_p, top_k, min_p)
    policy = _block_policy(block_size, draft, lookup)
    index = lookup_index(lookup, policy, draft)
    target, tokenizer, ids, prompt_cache = _inputs(
        model, draft, tokenizer, prompt, prompt_cache, kv
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
            lookup=index,
            prompt_progress_callback=prompt_progress_callback,
            logits_processors=logits_processors,
        )
        try:
            responses = _responses(blocks, ids, max_tokens, detokenizer, tic)
            yield from _dead_ends(responses, logits_processors)
        finally:
            blocks.close()  # roll back a block still in flight, now rather than at GC


def _inputs(model, draft, tokenizer, prompt, prompt_cache, kv=None):
    """(Target, wrapped tokenizer, prompt ids, prompt cache), checked; `kv`: the
    (bits, group size) of a quantized KV cache, or None."""
    if draft is not None:
        from .loading import check_compatible

        check_compatible(model, draft)
    target = as_target(model, draft)
    tokenizer = wrap_tokenizer(tokenizer)
    ids = encode_prompt(tokenizer, prompt)
    if not ids:
        raise ValueError(_EMPTY_TEXT if prompt else _EMPTY_IDS)
    if prompt_cache is None:
        prompt_cache = PromptCache(target, draft, *(kv or (None, 64)))
    elif not prompt_cache.fits(target, draft):
        raise ValueError(
            "This prompt_cache belongs to another model/drafter pair: make a new one."
        )
    elif kv is not None and not prompt_cache.quantized_as(*kv):
        raise ValueError(
            f"This prompt_cache was made with kv_bits={prompt_cache.kv_bits}, "
            f"kv_group_size={prompt_cache.kv_group_size}, not kv_bits={kv[0]}, "
            f"kv_group_size={kv[1]}: make it with make_prompt_cache(model, draft, "
            "kv_bits=..., kv_group_size=...), or leave kv_bits out to use it as it is."
        )
    return target, tokenizer, ids, prompt_cache


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
            source=block.source,
        )


def _dead_ends(responses, processors):
    """The last response's finish reason is "grammar" where a grammar processor ran
    out of tokens to allow (it ended the answer on a stop token)."""
    processors = [processors] if callable(processors) else processors or ()
    grammars = [p for p in processors if hasattr(p, "dead_end")]
    for response in responses:
        if response.finish_reason == "stop" and any(p.dead_end for p in grammars):
            response.finish_reason = DEAD_END
        yield response


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


def make_prompt_cache(
    model,
    draft=None,
    kv_bits: int | None = None,
    kv_group_size: int = 64,
    windows: bool = True,
) -> PromptCache:
    """Caches to pass to `stream_generate(prompt_cache=...)` across calls; `kv_bits`
    quantizes the target's attention caches (see `stream_generate`). Sliding-window
    layers keep only their window (and a little more) unless `windows` is False."""
    validate.kv_quantization(kv_bits, kv_group_size)
    target = as_target(model, draft)
    return PromptCache(target, draft, kv_bits, kv_group_size, windows)
