"""Measuring: every prompt turn under plain mlx-lm decoding and each (engine, block
size), timed the same way for all, with the losslessness check at temperature 0."""

import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field

import mlx.core as mx

from ..datasets import Sample, load_dataset, resolve
from .engines import BASELINE, PLAIN, Engine


@dataclass
class BenchConfig:
    datasets: list[str]
    block_sizes: list
    max_samples: int | None = None
    max_tokens: int = 256
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    thinking: bool = False
    seed: int = 42
    warmup_tokens: int = 16


@dataclass
class Record:
    """One measured generation: a prompt turn under one engine and block size."""

    dataset: str
    sample: str
    turn: int
    engine: str  # "baseline" (plain mlx-lm), "plain" (ours), "dflash", "reference"
    block_size: int | str
    prompt_tokens: int
    tokens: int
    ttft_s: float  # time to the first token (prefill + first sample)
    decode_s: float  # time from the first token to the last
    decode_tps: float  # (tokens - 1) / decode_s
    accept_lengths: list[int] = field(default_factory=list)
    # per verify step (aligned with accept_lengths), from engines that say: what
    # proposed its tokens ("draft", "lookup", "splice"; None: nothing, plain decoding),
    # how many were proposed (verified after the last token) and how many taken
    sources: list[str | None] = field(default_factory=list)
    proposed: list[int] = field(default_factory=list)
    taken: list[int] = field(default_factory=list)
    peak_memory_gb: float = 0.0
    # temperature 0 only: no mismatch with the baseline (identical, or differing only
    # at near-ties), the first differing token, and the classification
    # (engine/exactness.py: verdict, tokens checked, every difference with its gap)
    lossless: bool | None = None
    first_mismatch: int | None = None
    exactness: dict | None = None
    output: list[int] = field(default_factory=list, repr=False)

    @property
    def mean_tau(self) -> float | None:
        return statistics.fmean(self.accept_lengths) if self.accept_lengths else None

    def to_dict(self) -> dict:
        d = asdict(self)
        d.pop("output")
        d["mean_tau"] = self.mean_tau
        return d


def parse_block_sizes(text: str | None) -> list | None:
    """`--block-size` value: "16", "4,8,16" or "8,auto" → [16] / [4, 8, 16] / [8,
    "auto"]; None stays None. "auto" picks the size per block from measured speed."""
    if text is None or not str(text).strip():
        return None
    try:
        sizes = [
            p.strip() if p.strip() == "auto" else int(p)
            for p in str(text).split(",")
            if p.strip()
        ]
    except ValueError as e:
        raise ValueError(
            f"--block-size must be an integer, 'auto', or a comma list like "
            f"4,8,16,auto, got '{text}'."
        ) from e
    if not sizes or any(isinstance(s, int) and s < 2 for s in sizes):
        raise ValueError(
            "Block sizes must be >= 2 (1 is plain decoding, the baseline), "
            f"got '{text}'."
        )
    return list(dict.fromkeys(sizes))


def measure(engine: Engine, ids: list[int], max_tokens: int, block_size) -> dict:
    """Run one generation; timings are taken here, the same way for every engine."""
    mx.reset_peak_memory()
    tokens: list[int] = []
    taus: list[int] = []
    steps: list[dict] = []
    first, n_first = None, 0
    start = time.perf_counter()
    for step_tokens, accepted, *info in engine(ids, max_tokens, block_size):
        if first is None:
            first, n_first = time.perf_counter(), len(step_tokens)
        tokens.extend(int(t) for t in step_tokens)
        if accepted is not None:
            taus.append(int(accepted))
            steps.append(info[0] if info else {})
    end = time.perf_counter()
    first = end if first is None else first
    decode_s = end - first
    decoded = len(tokens) - n_first
    return dict(
        tokens=len(tokens),
        ttft_s=first - start,
        decode_s=decode_s,
        decode_tps=decoded / decode_s if decoded > 0 and decode_s > 0 else 0.0,
        accept_lengths=taus,
        sources=[s.get("source") for s in steps] if any(steps) else [],
        proposed=[s.get("proposed", 0) for s in steps] if any(steps) else [],
        taken=[s.get("taken", 0) for s in steps] if any(steps) else [],
        peak_memory_gb=mx.get_peak_memory() / 1e9,
        output=tokens,
    )


def chat_ids(tokenizer, messages: list[dict], thinking: bool) -> list[int]:
    """Prompt ids through the model's chat template (`enable_thinking` where it has
    one); without a template, the contents joined."""
    from ..conversation import chat_template, render, supports_thinking
    from ..generate import encode_prompt

    if not chat_template(tokenizer):
        if thinking:
            raise ValueError(
                "--thinking needs a chat template; this tokenizer has none."
            )
        return encode_prompt(tokenizer, render(tokenizer, messages, raw=True))
    if thinking and not supports_thinking(tokenizer):
        raise ValueError(
            "This model's chat template has no thinking switch (enable_thinking): "
            "drop --thinking."
        )
    return encode_prompt(tokenizer, render(tokenizer, messages, thinking=thinking))


def load_samples(config: BenchConfig) -> dict[str, list[Sample]]:
    """Every requested dataset, drawn with the config's seed and sample limit."""
    return {
        name: load_dataset(name, config.max_samples, config.seed)
        for name in resolve(",".join(config.datasets))
    }


def count_turns(samples: dict[str, list[Sample]]) -> int:
    return sum(len(s.turns) for items in samples.values() for s in items)


def _slots(
    engines: dict[str, Engine], block_sizes: list
) -> list[tuple[str, int | str]]:
    # "auto" is this package's adaptive block size; the reference has no such mode;
    # our plain decoding has one size
    slots: list[tuple[str, int | str]] = [(BASELINE, 1)]
    slots += [(PLAIN, 1)] if PLAIN in engines else []
    return slots + [
        (n, b)
        for b in block_sizes
        for n in engines
        if n not in (BASELINE, PLAIN) and not (b == "auto" and n == "reference")
    ]


def warmup(engines: dict[str, Engine], ids: list[int], config: BenchConfig):
    """A short generation per (engine, block size): compiles kernels, sizes buffers."""
    for name, bs in _slots(engines, config.block_sizes):
        for _ in engines[name](
            ids, max(1, min(config.warmup_tokens, config.max_tokens)), bs
        ):
            pass


def _measure_turn(engines, order, ids, config: BenchConfig, seed: int) -> dict:
    """Every slot's measurement of one prompt, run in `order`."""
    results = {}
    for name, bs in order:
        if config.temperature > 0:
            mx.random.seed(seed)
        results[(name, bs)] = measure(engines[name], ids, config.max_tokens, bs)
    return results


def run(
    tokenizer,
    engines: dict[str, Engine],
    samples: dict[str, list[Sample]],
    config: BenchConfig,
    referee: Callable | None = None,
) -> Iterator[list[Record]]:
    """Measure every prompt turn under the baseline and each (engine, block size).

    Yields the records of one turn at a time. The order of the runs rotates from one
    turn to the next, so neither mode always runs first. At temperature 0 each engine's
    tokens are compared with the baseline's (`Record.lossless`, `Record.exactness`);
    `referee(prompt_ids)` gives `exactness.classify` its (next_logits, continue_plain)
    to tell near-ties from mismatches (without one, any difference is a mismatch). In
    multi-turn sets the baseline's answer goes back into the history.
    """
    if BASELINE not in engines:
        raise ValueError(f"engines must include '{BASELINE}' (plain decoding).")
    if config.max_tokens < 1:
        raise ValueError(f"--max-tokens must be at least 1, got {config.max_tokens}.")
    slots = _slots(engines, config.block_sizes)
    first = next((s for items in samples.values() for s in items), None)
    if first is None:
        return
    opening = [{"role": "user", "content": first.turns[0]}]
    warmup(engines, chat_ids(tokenizer, opening, config.thinking), config)
    k = 0
    for items in samples.values():
        for sample in items:
            messages: list[dict] = []
            for turn, content in enumerate(sample.turns):
                messages.append({"role": "user", "content": content})
                ids = chat_ids(tokenizer, messages, config.thinking)
                order = slots[k % len(slots) :] + slots[: k % len(slots)]
                k += 1
                results = _measure_turn(engines, order, ids, config, config.seed + k)
                records = [
                    Record(
                        sample.dataset,
                        sample.id,
                        turn,
                        name,
                        bs,
                        len(ids),
                        **results[(name, bs)],
                    )
                    for name, bs in slots
                ]
                _check(records, config.temperature, referee, ids)
                yield records
                answer = _strip_stop(records[0].output, tokenizer)
                text = tokenizer.decode(answer, skip_special_tokens=True)
                messages.append({"role": "assistant", "content": text})


def _strip_stop(tokens: list[int], tokenizer) -> list[int]:
    stop = set(getattr(tokenizer, "eos_token_ids", None) or [])
    return tokens[:-1] if tokens and tokens[-1] in stop else tokens


def _check(records: list[Record], temperature: float, referee, ids: list[int]):
    """Each engine's output against the baseline's; the referee's callables are made
    once, and only if an output differs."""
    if temperature > 0:
        return
    from ..engine.exactness import IDENTICAL, MISMATCH, Exactness, classify

    base = records[0].output
    made: tuple | None = None
    for r in records[1:]:
        if r.output == base:
            result = Exactness(IDENTICAL, (), len(base))
        elif referee is None:
            result = Exactness(MISMATCH, (), 0)
        else:
            made = made or referee(ids)
            result = classify(base, r.output, *made)
        r.lossless, r.exactness = result.ok, result.to_dict()
        if r.output != base:
            r.first_mismatch = next(
                (
                    i
                    for i, (a, b) in enumerate(zip(r.output, base, strict=False))
                    if a != b
                ),
                min(len(r.output), len(base)),
            )
