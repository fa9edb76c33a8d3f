"""Sampling as the target and the drafter share it: the transform applied to their
logits (`SamplingParams`), draws from MLX's generator or from seeded Gumbel noise, and
the target's log-probabilities of the tokens it commits. A base module: the drafters
(models/) and the engine both use it.
"""

from dataclasses import dataclass

import mlx.core as mx

from .validate import finite, is_int


@dataclass(frozen=True)
class SamplingParams:
    """The transform applied identically to target and draft logits before sampling.

    Same semantics as `mlx_lm.sample_utils.make_sampler`, through its own filters: on
    the log-softmax at temperature 1, top-p, then min-p, then top-k, and the temperature
    only on what survives. 0 turns top-p, top-k and min-p off (top-p also at 1; top-k
    also when it covers the whole vocabulary); temperature 0 is greedy.
    """

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0

    def __post_init__(self):
        for name in ("temperature", "top_p", "min_p"):
            finite(name, getattr(self, name))
        if not is_int(self.top_k):
            raise ValueError(f"top_k must be an integer (0: off), got {self.top_k!r}.")
        if self.temperature < 0:
            raise ValueError(
                f"temperature must be >= 0 (0: greedy), got {self.temperature}."
            )
        if not 0 <= self.top_p <= 1:
            raise ValueError(
                f"top_p must be in [0, 1] (0 or 1: off), got {self.top_p}."
            )
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 disables it), got {self.top_k}.")
        if not 0 <= self.min_p <= 1:
            raise ValueError(f"min_p must be in [0, 1] (0: off), got {self.min_p}.")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def probs(self, logits: mx.array) -> mx.array:
        """Sampling distribution over the last axis (what `make_sampler` draws from)."""
        from mlx_lm.sample_utils import apply_min_p, apply_top_k, apply_top_p

        logprobs = logits.astype(mx.float32)
        logprobs = logprobs - mx.logsumexp(logprobs, axis=-1, keepdims=True)
        if 0 < self.top_p < 1:
            logprobs = apply_top_p(logprobs, self.top_p)
        if self.min_p != 0:
            logprobs = apply_min_p(logprobs, self.min_p)
        if 0 < self.top_k < logprobs.shape[-1]:
            logprobs = apply_top_k(logprobs, self.top_k)
        return mx.softmax(logprobs / self.temperature, axis=-1)

    def sample(self, logits: mx.array) -> mx.array:
        """One token per row of `logits` (argmax when greedy)."""
        if self.greedy:
            return mx.argmax(logits, axis=-1)
        return categorical(self.probs(logits))


def categorical(probs: mx.array) -> mx.array:
    """A draw per row of `probs`, from MLX's global generator."""
    return mx.random.categorical(mx.log(probs))


class SeededNoise:
    """Gumbel noise for each sequence position, drawn from a seed.

    argmax(log p + G_t) is an exact draw from p (the Gumbel-max trick). A seeded
    generation commits at position t the target's draw with G_t, so its output depends
    on the seed, the prompt and the target alone: not on the block sizes verified (which
    "auto" picks from timings), the drafter, other generations, or how many ranks share
    the target. Drafts drawn with the same G_t agree with the target as often as
    possible; they are accepted while they equal its draw (exact for any drafts)."""

    _MIX = 0x9E3779B97F4A7C15  # spreads (seed, position) over the 64-bit key space

    def __init__(self, seed: int):
        self.seed = int(seed)

    def at(self, start: int, count: int, vocab: int) -> mx.array:
        """(count, vocab) noise for positions start .. start + count - 1."""
        rows = [
            mx.random.gumbel((vocab,), key=mx.random.key(self._key(t)))
            for t in range(start, start + count)
        ]
        return mx.stack(rows)

    def _key(self, position: int) -> int:
        return (self.seed * self._MIX + position * 0x2545F4914F6CDD1D) % (1 << 64)


def perturbed(probs: mx.array, noise: mx.array) -> mx.array:
    """log probs + Gumbel noise: its argmax is a draw from probs."""
    return mx.log(probs) + noise


def token_logprobs(logits: mx.array, tokens: mx.array, top: int):
    """The target's log-probabilities (T, V) of `tokens` (T,) and its `top` (T, k) ids
    and log-probabilities, best first: the raw distribution, before any sampling
    transform."""
    logprobs = logits.astype(mx.float32)
    logprobs = logprobs - mx.logsumexp(logprobs, axis=-1, keepdims=True)
    chosen = mx.take_along_axis(logprobs, tokens[:, None], axis=-1)[:, 0]
    ids = mx.argpartition(-logprobs, top - 1, axis=-1)[:, :top]
    values = mx.take_along_axis(logprobs, ids, axis=-1)
    order = mx.argsort(-values, axis=-1)
    ids = mx.take_along_axis(ids, order, axis=-1)
    return chosen, ids, mx.take_along_axis(values, order, axis=-1)
