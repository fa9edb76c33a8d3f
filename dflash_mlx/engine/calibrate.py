"""Timing every block size before the first answer: the load-time warm-up as a
calibration of the adaptive policy.

A throwaway greedy generation (the engine's, in token ids) runs each size the policy
can choose (largest first, each `repeats` times, every draft verified) and hands the
policy what it measured: t(B) for each block size B (all drafts verified) and v(T) for
each verify size T.
The first run of a shape pays for compiling MLX's kernels, so the last run counts. Only
timings are kept: the acceptance of a throwaway prompt says nothing about the user's.

Timings belong to the machine and the pair, so they can be kept. With a `timings` file
(the CLI's is `timings_file(...)` under the user cache, keyed by CPU or chip, MLX
device, BLAS, versions, target and drafter), a later process reads them back and runs
one drafted block of the largest size as its warm-up instead of the whole schedule:
~2 s less to a cold `generate` of the demo pair. The first verify the policy measures
replaces the stored one and rescales the other stored times (see
`AdaptiveBlockSize._time`), so a stale file costs a few blocks, not the answer;
deleting the file times everything again.
"""

import hashlib
import json
from pathlib import Path
from typing import Any, cast

from .policy import AdaptiveBlockSize

# a prompt the target continues for a while: few early stop tokens
PROMPT = "Count from one to forty in words: one, two, three, four, five, six, seven,"
ATTEMPTS = 3  # generations tried when one ends (a stop token) before the schedule


class _Schedule:
    """A block-size policy that runs `order` and records what each block measured."""

    def __init__(self, order: list[int]):
        self.order = order
        self.measured: list[tuple[int, int, float, float | None]] = []

    @property
    def remaining(self) -> list[int]:
        return self.order[len(self.measured) :]

    def next(self, limit: int | None = None) -> int:
        size = (self.remaining or [1])[0]
        return size if limit is None else max(1, min(size, limit))

    def cut(self, confidence: list) -> int:
        # verify every draft; having a cut makes the engine time verify apart, as in
        # the adaptive policy's own blocks
        return len(confidence)

    def observe(
        self, size, n_accepted, seconds, verified=None, verify_seconds=None, **_
    ):
        if self.remaining:
            self.measured.append((size, verified or size, seconds, verify_seconds))


def calibrate(
    model,
    draft,
    tokenizer,
    policy: AdaptiveBlockSize | None = None,
    repeats: int = 2,
    timings: Path | None = None,
) -> AdaptiveBlockSize:
    """`policy` (default: `AdaptiveBlockSize.for_drafter(draft)`) with every size and
    verify size timed on this machine by a short throwaway generation.

    With `timings` (a JSON file), timings stored there for every size are read back and
    only one drafted block of the largest size runs as a warm-up (the policy corrects
    stored times with its own measurements); otherwise the full schedule runs and its
    timings are written there."""
    policy = policy or AdaptiveBlockSize.for_drafter(draft)
    stored = _read_timings(timings, policy.sizes) if timings else None
    if stored is not None:
        policy.seconds, policy.verify_seconds = stored
        # one block of the largest size, every draft verified: the drafter's weights
        # and both forwards' kernels are warm before the first answer times them
        largest = max(policy.sizes)
        hello = tokenizer.encode("Hello")
        for _ in _generate(
            model, draft, tokenizer, hello, block_size=largest, max_tokens=1 + largest
        ):
            pass
        return policy
    order = [s for s in reversed(policy.sizes) for _ in range(repeats)]
    for _ in range(ATTEMPTS):
        schedule = _run(model, draft, tokenizer, order)
        _adopt(policy, schedule.measured)
        order = schedule.remaining
        if not order:
            break
    if timings and all(s in policy.seconds for s in policy.sizes):
        _write_timings(timings, policy)
    return policy


def _run(model, draft, tokenizer, order: list[int]) -> _Schedule:
    """One throwaway generation of blocks of the sizes in `order`."""
    schedule = _Schedule(order)
    for _ in _generate(
        model,
        draft,
        tokenizer,
        tokenizer.encode(PROMPT),
        block_size=cast(Any, schedule),  # a policy object, as the engine allows
        max_tokens=1 + sum(order),
    ):
        pass
    return schedule


def _generate(model, draft, tokenizer, ids: list[int], block_size, max_tokens: int):
    """Greedy blocks after `ids` from the engine, as `stream_generate` runs it (on
    mlx-lm's generation stream, the model's memory wired), without the text."""
    from mlx_lm.generate import generation_stream, wired_limit
    from mlx_lm.tokenizer_utils import TokenizerWrapper

    from ..models.cache import PromptCache
    from ..sampling import SamplingParams
    from .loop import as_target, generate_blocks

    target = as_target(model, draft)
    if not isinstance(tokenizer, TokenizerWrapper):
        tokenizer = TokenizerWrapper(tokenizer)
    with wired_limit(target.model, [generation_stream]):
        blocks = generate_blocks(
            target,
            draft,
            ids,
            PromptCache(target, draft),
            SamplingParams(),
            block_size,
            max_tokens,
            frozenset(tokenizer.eos_token_ids),
            stream=generation_stream,
        )
        try:
            yield from blocks
        finally:
            blocks.close()


def timings_file(folder: Path, target: str, draft: str) -> Path:
    """Where the timings of this machine with this pair live: `folder`/<digest>.json,
    the digest of everything that sets them (a change of any gives a new file)."""
    from importlib.metadata import version

    import mlx.core as mx

    from .. import __version__
    from ..backend import cpu_name, detect_blas, for_device

    kernels = for_device()
    key = {
        "cpu": cpu_name(),
        "device": str(mx.default_device()),
        "blas": detect_blas(),
        "kernels": f"{kernels.name}/{kernels.linear.__name__}",
        "mlx": version("mlx"),
        "dflash_mlx": __version__,
        "target": str(target),
        "draft": str(draft),
    }
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()
    return Path(folder) / f"{digest[:16]}.json"


def _read_timings(path: Path, sizes: list[int]) -> tuple[dict, dict] | None:
    """(t(B), v(T)) from `path` when it times every size; None when it is missing or
    unreadable (a broken file is simply measured again and replaced)."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
        seconds = {int(k): float(v) for k, v in data["seconds"].items()}
        verify = {int(k): float(v) for k, v in data["verify_seconds"].items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    timed = all(seconds.get(s, 0) > 0 and verify.get(s, 0) > 0 for s in sizes)
    return (seconds, verify) if timed else None


def _write_timings(path: Path, policy: AdaptiveBlockSize):
    """Keep the timings for the next process; a cache that cannot be written is
    skipped (it only saves time)."""
    from ..files import write_text

    record = {"seconds": policy.seconds, "verify_seconds": policy.verify_seconds}
    try:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        write_text(path, json.dumps(record, indent=1))
    except OSError:
        pass


def _adopt(policy: AdaptiveBlockSize, measured: list):
    """Set the policy's timings from the schedule's blocks (later runs win)."""
    for size, verified, seconds, verify_seconds in measured:
        if verified != size:  # capped by the budget: not a full block of its size
            continue
        policy.seconds[size] = seconds
        if verify_seconds is not None:
            policy.verify_seconds[size] = verify_seconds
