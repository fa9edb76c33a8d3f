"""Several sequences decoded together: one drafter forward and one target forward per
step verify a block of every sequence (continuous batching of DFlash blocks).

Each sequence keeps its own sampling parameters, seed, stop tokens, budget and
logprobs; they share the block size: one policy for the batch, which times blocks per
batch width (verifying 8 rows costs more than 1: on a CPU the fastest size for 8 is
often plain decoding). A sequence joins after its prompt is prefilled alone (`join`
makes its PromptCache a row of the batch's caches, models/ragged.py) and leaves
between steps (`leave` gives its row back as a PromptCache, e.g. to the prefix cache).
Free rows are reused, and the caches are compacted when most rows are free.

With `lookup`, a sequence whose history has a copy (engine/lookup.py) verifies it in
the first positions of its block, the drafter's drafts after it; the block size is
the policy's plan for the most promising copy (engine/sources.py), else its `next`.

Each committed token is the target's own choice at its position (its argmax, its
seeded draw, or a rejection-sampling draw), exactly as in engine/loop.py, so a
sequence gets the tokens it gets alone wherever the target's kernels compute a row the
same whatever rows are computed beside it (docs/design-and-losslessness.md).
"""

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import mlx.core as mx

from ..models.cache import PromptCache
from ..models.draft_head import DraftHead
from ..models.ragged import BatchCaches
from ..models.target import Target
from ..sampling import SamplingParams, SeededNoise, token_logprobs
from .lockstep import Lockstep, shared_seed
from .lookup import LookupIndex
from .loop import Block
from .policy import MAX_LOOKUP, FixedBlockSize
from .processors import Processors, proposing
from .sources import DRAFT, LOOKUP, NAMES, SPLICE, Plan
from .step import accept, logprob_rows
from .trace import StepTrace
from .verify import one_hot


@dataclass(frozen=True)
class Request:
    """What one sequence asks of the batch."""

    params: SamplingParams = SamplingParams()
    max_tokens: int = 256  # -1: until a stop token
    stop_tokens: frozenset = frozenset()
    seed: int | None = None
    logprobs: int = 0
    # mlx-lm's (tokens, logits) -> logits, at each verified position (processors.py)
    logits_processors: tuple = ()


@dataclass(eq=False)
class Member:
    """A sequence in the batch."""

    request: Request
    row: int
    last: int  # the last committed token: its features are not computed yet
    tokens: list[int]  # what the caches hold (every committed token but `last`)
    produced: int  # tokens committed so far, the prefill's first included
    seeded: SeededNoise | None = None
    # features of committed tokens the drafter has not absorbed yet
    unabsorbed: list[mx.array] = field(default_factory=list)
    index: LookupIndex | None = None  # its history, for prompt lookup
    processors: Processors | None = None  # its logits processors, if any

    @property
    def room(self) -> float:
        budget = self.request.max_tokens
        return float("inf") if budget < 0 else budget - self.produced


class Batch:
    """The sequences decoding now, and one verify step for all of them."""

    def __init__(self, target: Target, draft, block_size=1, lookup: bool = False):
        self.target, self.draft, self.lookup = target, draft, lookup
        policy = FixedBlockSize(block_size) if isinstance(block_size, int) else None
        self.policy = policy or block_size
        if draft is None:
            self.policy = FixedBlockSize(1)
        elif target.group is not None and policy is None:
            self.policy = Lockstep(self.policy, target.group)  # rank 0's choices
        self.mask_id = draft.args.mask_token_id if draft is not None else 0
        self.head = DraftHead.for_drafter(target, draft) if draft is not None else None
        if self.head is not None and self.head.rows is not None:
            # made here, used on the engine's thread: no lazy graph may cross threads
            mx.eval(self.head.rows.parameters())
        self.caches: BatchCaches | None = None
        self.members: list[Member | None] = []  # by row; None: a free row
        self._keeps: list[int] = []  # tokens each row kept in the last step
        self.trace: StepTrace | None = None  # engine/trace.py, when asked for

    @property
    def active(self) -> list[Member]:
        return [m for m in self.members if m is not None]

    def __len__(self) -> int:
        return len(self.active)

    @property
    def nbytes(self) -> int:
        return 0 if self.caches is None else self.caches.nbytes

    # -- joining and leaving --------------------------------------------------------
    def join(self, request: Request, cache: PromptCache, first: int) -> Member:
        """Add a sequence whose prompt `cache` holds, `first` its committed token."""
        if self.caches is None:
            self.caches = BatchCaches(self.target, self.draft)
        row = next((i for i, m in enumerate(self.members) if m is None), None)
        if row is None:
            row = len(self.members)
            self.members.append(None)
            self.caches.add_rows(1)
        self.caches.put(row, cache)
        seeded = None
        seed = request.seed
        if seed is None and self.target.group is not None:
            seed = shared_seed(self.target.group)  # every rank draws alike
        if seed is not None and not request.params.greedy:
            seeded = SeededNoise(seed)
        member = Member(request, row, first, list(cache.tokens), 1, seeded)
        member.processors = Processors.of(request.logits_processors or None)
        if self.lookup:
            member.index = LookupIndex()
            member.index.sync([*cache.tokens, first])
        self.members[row] = member
        return member

    @property
    def _caches(self) -> BatchCaches:
        assert self.caches is not None, "no sequence has joined"
        return self.caches

    def leave(self, member: Member, into: PromptCache) -> PromptCache:
        """Remove `member`; `into` (a fresh PromptCache) gets its row's caches."""
        self._absorb([member])
        self._caches.take(member.row, into)
        into.tokens = list(member.tokens)
        self.members[member.row] = None
        self._compact()
        return into

    def _compact(self):
        live = [i for i, m in enumerate(self.members) if m is not None]
        if not live:
            self.caches, self.members = None, []
        elif len(live) * 2 <= len(self.members):  # a copy of every row pays now
            self.caches.keep_rows(live)
            self.members = [self.members[i] for i in live]
            for row, member in enumerate(self.members):
                member.row = row

    # -- one step -------------------------------------------------------------------
    def step(self) -> list[tuple[Member, Block]]:
        """Verify one block of every sequence (one sync): each one's new tokens."""
        members = self.active
        if not members:
            return []
        trace = self.trace
        if trace is not None:
            trace.start()
        start = time.perf_counter()
        at_width = getattr(self.policy, "at_width", None)
        if at_width is not None:  # the rows verified, free ones included
            at_width(len(self.members))
        room = min(m.room for m in members)
        size, copies = self._plan(members, int(min(room, 1 << 30)))
        drafts = q_rows = None
        if size > 1:
            if any(len(copies.get(m.row, ())) < size - 1 for m in members):
                self._absorb(members)
                if trace is not None:
                    trace.phase("upkeep", [c.state for c in self._caches.draft])
                drafts, q_rows = self._draft(members, size)
                if trace is not None:
                    trace.phase("draft", drafts, list(q_rows.values()))
            drafts, q_rows = self._splice(drafts, q_rows, copies, size)
            drafts, q_rows = self._shape(members, drafts, q_rows)
        ids = self._lasts()[:, None]
        if drafts is not None:
            ids = mx.concatenate([ids, drafts.astype(ids.dtype)], axis=1)
        tape: list | None = [] if self.target.recurrent else None
        hidden, features = self.target(ids, self._caches.target, tape)
        logits = self.target.logits(hidden)
        results, logprobs = self._accept(members, drafts, q_rows, logits, size)
        outputs = [results, *[a for rows in logprobs.values() for a in rows]]
        if trace is None:
            mx.eval(outputs)
        else:
            trace.phase("verify", outputs)
        rows = results.tolist()
        seconds = time.perf_counter() - start
        blocks = self._commit(members, rows, logprobs, features, size, copies, seconds)
        self.target.rollback_rows(self._caches.target, tape or [], self._keeps)
        if trace is not None:
            self._traced(trace, members, blocks, size, copies, seconds)
        return blocks

    def _traced(self, trace: StepTrace, members, blocks, size, copies, seconds):
        policy = self.policy
        rate = getattr(policy, "rate", None)  # a fixed size has none
        rates = {s: rate(s) for s in getattr(policy, "sizes", ())} if rate else {}
        trace.write(
            "step",
            width=len(self.members),
            rows=len(members),
            size=size,
            copies=len(copies),
            accepted=[b.from_draft for _, b in blocks],
            tokens=sum(len(b.tokens) for _, b in blocks),
            step_ms=round(seconds * 1e3, 3),
            rates={s: round(r, 1) for s, r in rates.items() if r is not None},
            exploring=getattr(policy, "exploring", None) == size,
        )

    def _plan(self, members, limit: int) -> tuple[int, dict[int, list[int]]]:
        """The block size, and the rows' lookup copies (row -> ids) to verify."""
        plan = getattr(self.policy, "plan", None)
        if not self.lookup or plan is None or limit < 2:
            return self.policy.next(limit=limit), {}
        cap = min(getattr(self.policy, "max_lookup", MAX_LOOKUP), limit - 1)
        copies, best = {}, None
        for m in members:
            copy = m.index.propose(cap) if m.index is not None else []
            if copy:
                copies[m.row] = copy
                key = (m.index.match, len(copy))
                best = max(best or key, key)
        if best is None:
            return self.policy.next(limit=limit), {}
        chosen = plan(limit, best[1], best[0], self.draft is not None)
        if chosen.source == DRAFT:
            return chosen.size, {}
        return chosen.size, {r: c[: chosen.size - 1] for r, c in copies.items()}

    def _splice(self, drafts, q_rows, copies: dict, size: int):
        """Each row's copy in place of its first drafts (q one-hot there)."""
        if not copies:
            return drafts, q_rows
        vocab = self.target.vocab_size
        if drafts is None:  # every row verifies a copy: no drafter forward
            drafts = mx.zeros((len(self.members), size - 1), mx.int32)
            q_rows = {}
        rows = [drafts[i] for i in range(len(self.members))]
        for row, copy in copies.items():
            head = mx.array(copy, drafts.dtype)
            rows[row] = mx.concatenate([head, rows[row][len(copy) :]])
            q = q_rows.get(row)
            if q is not None or (row not in q_rows and len(copy) == size - 1):
                tail = q[len(copy) :] if q is not None else mx.zeros((0, vocab))
                q_rows[row] = mx.concatenate([one_hot(head, vocab), tail])
        return mx.stack(rows), q_rows

    def _shape(self, members, drafts, q_rows):
        """Each grammar's tokens in its row's drafts (step._shaped's, uncut)."""
        shaped = [m for m in members if proposing(m.processors)]
        if drafts is None or not shaped:
            return drafts, q_rows
        rows = drafts.tolist()  # a sync the grammar's mask makes anyway
        for m in shaped:
            q = q_rows.get(m.row)
            rows[m.row], _, q = m.processors.shape(m.tokens, m.last, rows[m.row], q)
            if q is not None:
                q_rows[m.row] = q
        return mx.array(rows, drafts.dtype), q_rows

    def _lasts(self) -> mx.array:
        lasts = [0] * len(self.members)  # free rows verify a dummy token, kept never
        for m in self.active:
            lasts[m.row] = m.last
        return mx.array(lasts)

    def _noise(self, member: Member, size: int):
        """A seeded sequence's noise for the block's positions after `last`."""
        if member.seeded is None:
            return None
        position = len(member.tokens) + 1
        return member.seeded.at(position, size, self.target.vocab_size)

    def _draft(self, members, size: int):
        """Proposals (rows, size - 1) for every row, and the q rows of the sampled."""
        target, draft, head = self.target, self.draft, self.head
        assert head is not None  # a drafter's batch
        lasts = self._lasts()[:, None]
        masks = mx.full((lasts.shape[0], size - 1), self.mask_id, lasts.dtype)
        block = mx.concatenate([lasts, masks], axis=1)
        h = target.embed(block)
        if draft.args.input_embedding_scale != 1.0:
            h = h * draft.args.input_embedding_scale
        h = draft(h, self._caches.draft)[:, 1:]
        logits = draft.finalize_logits(head(h.astype(target.dtype)))
        argmax = head.to_target(mx.argmax(logits, axis=-1), None)[0]
        rows = [argmax[i] for i in range(len(self.members))]
        q_rows: dict[int, mx.array] = {}
        for m in members:
            params = m.request.params
            if params.greedy and draft.argmax_proposals:
                continue  # the argmax above is its proposal
            noise = self._noise(m, size)
            if noise is not None:
                noise = noise[: size - 1]
                noise = noise if head.vocab is None else noise[:, head.vocab]
            picked, q = draft.propose(
                h[m.row], logits[m.row], block[m.row, 0], params, noise
            )
            rows[m.row], q = head.to_target(picked, q)
            if q is not None:
                q_rows[m.row] = q
        return mx.stack(rows), q_rows

    def _accept(self, members, drafts, q_rows, logits, size):
        """(rows, 1 + size) ints, each row its accepted drafts then the tokens it
        commits; and the logprob arrays of the rows that asked for them."""
        out = [mx.zeros((1 + size,), mx.int32)] * len(self.members)
        logprobs = {}
        if any(m.processors is not None for m in members):
            mx.async_eval(logits)  # the target verifies while the processors run
        for m in members:
            d = None if drafts is None else drafts[m.row]
            q = None if q_rows is None else q_rows.get(m.row)
            params, noise = m.request.params, self._noise(m, size)
            row = logits[m.row]
            if m.processors is not None:
                row = m.processors.apply(m.tokens, m.last, row, d)
            accepted, emitted = accept(params, d, q, row, noise)
            out[m.row] = mx.concatenate(
                [accepted[None].astype(mx.int32), emitted.astype(mx.int32)]
            )
            if m.request.logprobs > 0:
                top = m.request.logprobs
                logprobs[m.row] = token_logprobs(logits[m.row], emitted, top)
        return mx.stack(out), logprobs

    def _commit(self, members, rows, logprobs, features, size, copies, seconds):
        """Keep each row's committed tokens (`_keeps`: how many, per row)."""
        blocks, self._keeps = [], [0] * len(self.members)
        for m in members:
            accepted, emitted = rows[m.row][0], rows[m.row][1:]
            tokens = emitted[: accepted + 1]
            stops = (i + 1 for i, t in enumerate(tokens) if t in m.request.stop_tokens)
            tokens = tokens[: int(min(next(stops, len(tokens)), m.room))]
            self._keeps[m.row] = len(tokens)
            if self.draft is not None:
                m.unabsorbed.append(features[m.row : m.row + 1, : len(tokens)])
            m.tokens.append(m.last)
            m.tokens.extend(tokens[:-1])
            m.last, m.produced = tokens[-1], m.produced + len(tokens)
            if m.index is not None:
                m.index.extend(tokens)
            plan = _row_plan(size, len(copies.get(m.row, ())))
            block = Block(
                tokens,
                min(accepted, len(tokens)),
                size,
                tokens[-1] in m.request.stop_tokens,
                logprobs=logprob_rows(logprobs.get(m.row), len(tokens)),
                source=NAMES[plan.source] if size > 1 else None,
            )
            blocks.append((m, block))
            extra = {}
            if plan.source != DRAFT:
                match = m.index.match if m.index is not None else 0
                extra = dict(source=plan.source, match=match, copied=plan.copied)
            # one step: timed once, one turn of the exploration schedule; every
            # row's acceptance counts
            self.policy.observe(
                size, accepted, seconds, verified=size, step=m is members[0], **extra
            )
        return blocks

    def _absorb(self, members: Sequence[Member]):
        """Feed the drafter the features it has not seen, every row at once."""
        pending = [m for m in members if m.unabsorbed]
        if self.draft is None or not pending:
            return
        counts = [0] * len(self.members)
        parts = {}
        for m in pending:
            parts[m.row] = mx.concatenate(m.unabsorbed, axis=1)
            counts[m.row] = parts[m.row].shape[1]
            m.unabsorbed.clear()
        width, like = max(counts), next(iter(parts.values()))
        padded = []
        for row in range(len(self.members)):
            part = parts.get(row, like[:, :0])
            padded.append(mx.pad(part, [(0, 0), (0, width - part.shape[1]), (0, 0)]))
        self.draft.absorb(mx.concatenate(padded, axis=0), self._caches.draft, counts)


def _row_plan(size: int, copied: int) -> Plan:
    """What a row's block was: a copy alone, a copy then drafts, or drafts."""
    if copied and copied >= size - 1:
        return Plan(LOOKUP, 1 + copied, copied)
    return Plan(SPLICE if copied else DRAFT, size, copied)
