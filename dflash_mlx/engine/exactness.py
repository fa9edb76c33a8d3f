"""Reading a difference from plain greedy decoding: identical, a near-tie, or a bug.

Kernels that are not batch-invariant (MLX's generic ones, which a Mac's GPU runs) can
round a token verified inside a block differently from the same token decoded alone.
Where the target's two best logits are that close, greedy DFlash may then pick the
other one: a tie broken the other way, not a mistake. Everything after such a token
follows a different but equally valid history.

`classify` tells the cases apart. At the first token where DFlash differs from plain
decoding it reads the target's logits there (plain decoding's context), and calls the
difference a near-tie when both tokens are within `tolerance` of the top logit. It then
checks the rest against plain decoding continued from DFlash's token, so every later
difference is classified too, up to `max_ties`. Any other difference (a token far from
the top, or an output that stops early or runs on) is a mismatch: a bug.

In token ids, like the engine: the callers (bench, `generate --check`) supply
`next_logits(output_prefix)` and `continue_plain(output_prefix, n)` for their prompt.
"""

from collections.abc import Callable
from dataclasses import asdict, dataclass

import mlx.core as mx

IDENTICAL, NEAR_TIE, MISMATCH = "identical", "near_tie", "mismatch"

# A near-tie: both tokens' logits within this fraction of max(|top logit|, 1) of the
# top one. About two units in the last place of bfloat16 and float16 logits (2^-7 and
# 2^-10 relative); float32 gets 2^-12: its rounding grows over the layers far past an
# ulp. A real bug's token is almost never that close to the top.
RELATIVE_TOLERANCE = {"bfloat16": 2.0**-6, "float16": 2.0**-9, "float32": 2.0**-12}


def tolerance(logits: mx.array) -> float:
    """The absolute near-tie bound for one position's logits (their dtype's)."""
    name = str(logits.dtype).rsplit(".", 1)[-1]
    relative = RELATIVE_TOLERANCE.get(name, RELATIVE_TOLERANCE["float32"])
    top = float(mx.max(logits.astype(mx.float32)))
    return relative * max(abs(top), 1.0)


@dataclass(frozen=True)
class Difference:
    """One token where DFlash left plain decoding (None: that side had stopped)."""

    index: int  # position in the generated output
    expected: int | None  # plain decoding's token
    got: int | None  # DFlash's token
    gap: float | None = None  # logit[expected] - logit[got], plain decoding's context
    tolerance: float | None = None


@dataclass(frozen=True)
class Exactness:
    """A verdict and the differences behind it, in output order."""

    verdict: str  # IDENTICAL, NEAR_TIE or MISMATCH
    differences: tuple[Difference, ...] = ()
    checked: int = 0  # output tokens compared (all, unless max_ties stopped it)

    @property
    def ok(self) -> bool:
        return self.verdict != MISMATCH

    def to_dict(self) -> dict:
        return {
            "verdict": self.verdict,
            "checked": self.checked,
            "differences": [asdict(d) for d in self.differences],
        }

    def describe(self) -> str:
        """One line for people."""
        if self.verdict == IDENTICAL:
            return f"identical to plain decoding ({self.checked} tokens)"
        last = self.differences[-1]
        if self.verdict == MISMATCH:
            return f"MISMATCH with plain decoding: {_describe(last)}"
        ties = "; ".join(_describe(d) for d in self.differences)
        return f"identical up to {len(self.differences)} near-tie(s): {ties}"


def _describe(d: Difference) -> str:
    if d.gap is None:
        side = "plain decoding" if d.expected is None else "DFlash"
        return f"token {d.index}: {side} stopped, the other went on"
    return (
        f"token {d.index}: plain {d.expected}, DFlash {d.got}, logit gap "
        f"{d.gap:.3g} (near-tie tolerance {d.tolerance:.3g})"
    )


def _first_difference(a: list[int], b: list[int], start: int) -> int | None:
    for i in range(start, min(len(a), len(b))):
        if a[i] != b[i]:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def classify(
    reference: list[int],
    output: list[int],
    next_logits: Callable[[list[int]], mx.array],
    continue_plain: Callable[[list[int], int], list[int]] | None = None,
    max_ties: int = 8,
) -> Exactness:
    """Compare DFlash's `output` with plain decoding's `reference` (same prompt).

    `next_logits(prefix)`: the target's logits for the token after prompt + prefix.
    `continue_plain(prefix, n)`: plain decoding's next (up to) n tokens after it;
    without it only the first difference is classified.
    """
    differences: list[Difference] = []
    start = 0
    while (i := _first_difference(reference, output, start)) is not None:
        expected = reference[i] if i < len(reference) else None
        got = output[i] if i < len(output) else None
        if expected is None or got is None:  # one side stopped: never a tie
            differences.append(Difference(i, expected, got))
            return Exactness(MISMATCH, tuple(differences), i)
        logits = next_logits(output[:i]).reshape(-1)
        values = logits.astype(mx.float32)
        top = float(mx.max(values))
        a, b = float(values[expected]), float(values[got])
        bound = tolerance(logits)
        differences.append(Difference(i, expected, got, a - b, bound))
        if top - a > bound or top - b > bound:
            return Exactness(MISMATCH, tuple(differences), i)
        if continue_plain is None or len(differences) >= max_ties:
            return Exactness(NEAR_TIE, tuple(differences), i + 1)
        prefix = output[: i + 1]
        reference = prefix + continue_plain(prefix, len(output) - len(prefix))
        start = i + 1
    verdict = NEAR_TIE if differences else IDENTICAL
    return Exactness(verdict, tuple(differences), len(output))


def referee(model, tokenizer, prompt: list[int], kv_bits=None, kv_group_size=64):
    """(next_logits, continue_plain) for `classify`, from an mlx-lm model: one full
    forward for the logits, mlx-lm's own greedy decoding to continue; with `kv_bits`,
    both on the target's KV cache quantized as DFlash's was (`Target.make_cache`)."""
    import mlx_lm

    def caches():
        if kv_bits is None:
            return None
        from ..models.target import Target

        return Target(model).make_cache(kv_bits, kv_group_size)

    def next_logits(prefix: list[int]) -> mx.array:
        return model(mx.array([prompt + prefix]), cache=caches())[0, -1]

    def continue_plain(prefix: list[int], n: int) -> list[int]:
        if n <= 0:
            return []
        ids = prompt + prefix
        steps = mlx_lm.stream_generate(
            model, tokenizer, ids, max_tokens=n, prompt_cache=caches()
        )
        return [r.token for r in steps]

    return next_logits, continue_plain


def check(
    model,
    tokenizer,
    prompt: list[int],
    output: list[int],
    kv_bits=None,
    kv_group_size=64,
) -> Exactness:
    """`output` (DFlash's greedy tokens for `prompt`) against plain mlx-lm greedy
    decoding of the same prompt, as many tokens long: `generate --check`."""
    next_logits, continue_plain = referee(
        model, tokenizer, prompt, kv_bits, kv_group_size
    )
    reference = continue_plain([], len(output))
    return classify(reference, output, next_logits, continue_plain)
