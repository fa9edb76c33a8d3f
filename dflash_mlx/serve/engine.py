"""The server's MLX side: prompts restored from the prefix cache, prefilled in chunks,
then decoded together in one batch (engine/batch.py).

`ServeEngine` makes explicit moves: admit a job, prefill one chunk of a sequence, step
the decoding sequences, end a sequence. The scheduler decides when each happens; on a
sharded target every rank makes the same moves in the same order (serve/mirror.py).
Targets whose caches cannot be batched (models/ragged.py says which), and quantized KV
caches (`--kv-bits`: the batch's caches are float), decode one block per sequence per
step instead, each on its own caches.
"""

import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import mlx.core as mx

from ..engine.batch import Batch, Request
from ..engine.lockstep import shared_seed
from ..engine.lookup import LookupIndex
from ..engine.loop import Block, generate_blocks
from ..engine.prefill import first_token, prefill
from ..engine.processors import Processors
from ..engine.trace import StepTrace
from ..models.cache import PromptCache
from ..models.prefix import PrefixStore
from ..models.ragged import BatchCaches
from ..models.snapshots import take_snapshot
from ..sampling import SamplingParams, SeededNoise

if TYPE_CHECKING:
    from .scheduler import Job

log = logging.getLogger("dflash_mlx.serve")

PREFILL_STEP = 2048  # prompt tokens a forward when nothing else is decoding
LADDER = 8  # at most this many snapshots inside one long prompt (recurrent targets)
LADDER_STEP = 1024  # ... at least this many tokens apart


def snapshot_points(length: int, reused: int, boundaries) -> list[int]:
    """Where a prompt of `length` tokens, `reused` of them restored, has its
    recurrent states kept: the `boundaries`, and a ladder of rungs through a long
    prefill. A rung within a step of the restored prefix would only split a
    follow-up turn's short prefill in two (a forward and a sync more) to keep a
    state a few tokens from the one it was restored from."""
    step = max(LADDER_STEP, length // LADDER)
    ladder = [p for p in range(step, length, step) if p - reused >= step]
    return sorted({p for p in (*boundaries, *ladder) if reused < p < length})


@dataclass(eq=False)
class Sequence:
    """One request from admission to its end."""

    key: int
    job: "Job"
    cache: PromptCache | None  # its own caches while prefilling
    reused: int  # prompt tokens the prefix cache served
    todo: list[int]  # prompt tokens still to prefill
    points: list[int]  # positions to snapshot at, ahead of the prefill
    snapshots: dict = field(default_factory=dict)
    member: Any = None  # its place among the decoding sequences
    prefill_seconds: float = 0.0
    decode_start: float = 0.0
    produced: int = 0  # tokens committed, the prefill's first included

    @property
    def prefilling(self) -> bool:
        return self.member is None


class ServeEngine:
    """Every sequence the server is working on, and the moves that advance them."""

    def __init__(
        self,
        target,
        draft,
        stop_tokens: frozenset,
        store: PrefixStore,
        block_size,
        prefill_chunk: int = 512,
        lookup: bool = False,
        trace: StepTrace | None = None,
    ):
        self.target, self.draft, self.store = target, draft, store
        self.stop_tokens, self.prefill_chunk = stop_tokens, prefill_chunk
        reason = BatchCaches.supports(target, store.make_cache().target)
        if reason is not None:
            log.warning("decoding one sequence at a time: %s", reason)
        lane = Batch if reason is None else Solo
        self.decoding = lane(target, draft, block_size, lookup)
        self.trace = self.decoding.trace = trace  # engine/trace.py (None: off)
        self.sequences: dict[int, Sequence] = {}
        self.snapshot_seconds = 0.0  # taking prefix-cache snapshots, in all
        self.prefill_tokens = 0  # prompt tokens prefilled, in all (GET /metrics)
        self.prefill_seconds = 0.0  # ... and the seconds it took, snapshots included
        self.token_bytes = 0.0  # cache bytes a token takes (seen at the first prefill)

    def admit(self, key: int, job, reuse: int | None = None) -> Sequence:
        """Restore the longest cached prefix of `job.prompt` (at most `reuse` tokens
        when given: a follower rank restores what rank 0 did); the rest waits."""
        prompt = list(job.prompt)
        cache, reused = self.store.restore(prompt, reuse)
        if reuse is not None and reused != reuse:
            raise RuntimeError(f"restored {reused} prompt tokens where rank 0 {reuse}")
        points = []  # every layer a KV history: a prefix of any length rebuilds
        if not self.store.cut_anywhere:
            points = snapshot_points(len(prompt), reused, job.boundaries)
        seq = Sequence(key, job, cache, reused, prompt[reused:], points)
        self.sequences[key] = seq
        return seq

    def prefill(self, seq: Sequence) -> Block | None:
        """Prefill one chunk of `seq`; the Block of its first token once the whole
        prompt is in (the sequence then decodes with the others)."""
        start, cache = time.perf_counter(), seq.cache
        assert cache is not None
        done = len(cache.tokens)
        # small chunks only while others decode: alone, a prompt goes in at full speed
        chunk = self.prefill_chunk if len(self.decoding) else PREFILL_STEP
        end = done + min(len(seq.todo), chunk)
        end = next((p for p in seq.points if done < p <= end), end)
        ids, seq.todo = seq.todo[: end - done], seq.todo[end - done :]
        logits = prefill(self.target, self.draft, cache, ids, len(ids))
        if seq.todo:
            mx.eval([c.state for c in cache.target + (cache.draft or [])])
            if end in seq.points:
                seq.snapshots[end] = self._snapshot(cache)
            self._spent(seq, start, len(ids))
            return None
        if not self.token_bytes:
            self.token_bytes = cache.nbytes / len(cache.tokens)
        if not self.store.cut_anywhere:  # the prompt's end: the next turn starts here
            seq.snapshots[len(cache.tokens)] = self._snapshot(cache)
        job = seq.job
        params = SamplingParams(job.temperature, job.top_p, job.top_k, job.min_p)
        seeded = None if job.seed is None else SeededNoise(job.seed)
        if seeded is None and self.target.group is not None and not params.greedy:
            seeded = SeededNoise(shared_seed(self.target.group))
        processors = Processors.of(job.logits_processors or None)
        token, rows = first_token(
            self.target, params, seeded, logits, len(cache.tokens), job.logprobs,
            processors, cache.tokens,
        )  # fmt: skip
        self._spent(seq, start, len(ids))
        seq.produced, seq.decode_start = 1, time.perf_counter()
        finished = token in self.stop_tokens
        if not finished and job.max_tokens > 1:
            stops, budget = self.stop_tokens, job.max_tokens
            request = Request(
                params, budget, stops, job.seed, job.logprobs, job.logits_processors
            )
            seq.member = self.decoding.join(request, cache, token)
            seq.cache = None
        return Block([token], 0, 1, finished, reused=seq.reused, logprobs=rows)

    def _spent(self, seq: Sequence, start: float, tokens: int):
        seconds = time.perf_counter() - start
        seq.prefill_seconds += seconds
        self.prefill_tokens += tokens
        self.prefill_seconds += seconds
        if self.trace is not None:
            self.trace.write(
                "prefill",
                tokens=tokens,
                context=len(seq.cache.tokens) if seq.cache is not None else 0,
                decoding=len(self.decoding),
                prefill_ms=round(seconds * 1e3, 3),
            )

    def _snapshot(self, cache: PromptCache):
        tick = time.perf_counter()
        snapshot = take_snapshot(cache)
        self.snapshot_seconds += time.perf_counter() - tick
        return snapshot

    def step(self) -> list[tuple[Sequence, Block]]:
        """One verified block of every decoding sequence."""
        by_member = {s.member: s for s in self.sequences.values() if s.member}
        out = []
        for member, block in self.decoding.step():
            seq = by_member[member]
            seq.produced += len(block.tokens)
            out.append((seq, block))
        return out

    def end(self, key: int, keep: bool = True) -> list[tuple]:
        """Forget sequence `key`, its caches kept in the prefix store unless told
        not to; the store's evicted paths (for the other ranks)."""
        seq = self.sequences.pop(key)
        cache = seq.cache
        if seq.member is not None:
            cache = self.decoding.leave(seq.member, self.store.make_cache())
        if not keep or cache is None or not cache.tokens:
            return []
        return self.store.insert(cache.tokens, cache, seq.snapshots)

    def drop_decoding(self):
        """After a failed step: forget every decoding sequence (their caches are in
        an unknown state) and start the decoding lane afresh."""
        for key in [k for k, s in self.sequences.items() if s.member is not None]:
            del self.sequences[key]
        self.decoding = type(self.decoding)(
            self.target, self.draft, self.decoding.policy, self.decoding.lookup
        )
        self.decoding.trace = self.trace

    @property
    def kv_bytes(self) -> int:
        return self.decoding.nbytes

    def fits(self, job, budget: int) -> bool:
        """Whether decoding `job` beside the others may stay within `budget` bytes
        of caches: a batch's rows all grow to its longest (models/ragged.py)."""
        if not budget or not self.sequences or not self.token_bytes:
            return True
        longest = max(
            len(s.job.prompt) + s.job.max_tokens for s in self.sequences.values()
        )
        longest = max(longest, len(job.prompt) + job.max_tokens)
        rows = len(self.sequences) + 1
        return rows * longest * self.token_bytes <= budget

    def cache_report(self) -> dict:
        """The prefix cache in numbers (GET /health, /metrics)."""
        store, spill = self.store, self.store.spill
        stats = store.stats
        report: dict[str, Any] = {
            "entries": len(store),
            "bytes": store.nbytes,
            "max_bytes": store.max_bytes,
            "hits": stats.hits,
            "misses": stats.misses,
            "reused_tokens": stats.reused_tokens,
            "evicted": stats.evicted,
        }
        if spill is not None:
            report["disk"] = {
                "dir": str(spill.folder),
                "files": len(spill.entries),
                "bytes": spill.nbytes,
                "max_bytes": spill.max_bytes,
            }
        return report

    def close(self):
        """At shutdown: what RAM holds goes to disk (warm after a restart)."""
        if self.trace is not None:
            self.trace.close()
        spill = self.store.spill
        if spill is None:
            return
        try:
            self.store.spill_all()
        finally:
            spill.close()


@dataclass(eq=False)
class _Solo:
    request: Request
    cache: PromptCache
    blocks: object  # generate_blocks's generator
    produced: int = 1


class Solo:
    """The decoding lane for targets whose caches cannot be batched: one block per
    sequence per step, each on its own caches (engine/loop.py)."""

    def __init__(self, target, draft, block_size, lookup: bool = False):
        self.target, self.draft, self.policy = target, draft, block_size
        self.lookup = lookup
        self.members: list[_Solo] = []
        self.trace = None  # only a batch's steps are traced (engine/trace.py)

    def __len__(self) -> int:
        return len(self.members)

    @property
    def nbytes(self) -> int:
        return sum(m.cache.nbytes for m in self.members)

    def join(self, request: Request, cache: PromptCache, first: int) -> _Solo:
        # the first token's features are computed as its own one-token prefill
        budget = -1 if request.max_tokens < 0 else request.max_tokens - 1
        blocks = generate_blocks(
            self.target,
            self.draft,
            [*cache.tokens, first],
            cache,
            request.params,
            self.policy,
            budget,
            request.stop_tokens,
            seed=request.seed,
            logprobs=request.logprobs,
            lookup=LookupIndex() if self.lookup else None,
            logits_processors=request.logits_processors or None,
        )
        member = _Solo(request, cache, blocks)
        self.members.append(member)
        return member

    def step(self) -> list[tuple[_Solo, Block]]:
        out = []
        for m in list(self.members):
            block = next(m.blocks, None)  # type: ignore[call-overload]
            if block is None:
                continue
            m.produced += len(block.tokens)
            out.append((m, block))
        return out

    def leave(self, member: _Solo, into: PromptCache) -> PromptCache:
        member.blocks.close()  # type: ignore[attr-defined]
        self.members.remove(member)
        return member.cache
