"""The engine thread: the only code in the server that touches MLX.

HTTP handlers submit a `Job` (token ids and sampling options) and read plain-Python
events from their `Ticket`. Up to `max_concurrency` jobs are worked on at once by one
`ServeEngine` (serve/engine.py): each is restored from the prefix cache, prefilled in
chunks taken in turn with the decoding steps (so a long prompt does not stall the
others), then decoded in one batch with every other job, one verified block per job
per step. The rest wait in a bounded queue. A cancelled or timed-out job ends at the
next turn; its caches go to the prefix cache (mid-prefill: the tokens prefilled so far,
so a client that retries resumes there). While a job prefills, its ticket gets a
`Prefilled` event after each chunk (streams turn them into keep-alives).
"""

import asyncio
import logging
import queue
import threading
import time
from dataclasses import dataclass

log = logging.getLogger("dflash_mlx.serve")
IDLE_TRIM_S = 5.0  # idle this long: freed memory goes back to the system


@dataclass(frozen=True)
class Job:
    """What one request asks of the engine, in token ids."""

    prompt: tuple[int, ...]
    max_tokens: int
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None
    logprobs: int = 0  # alternatives per token to report; 0 = none
    # prompt positions worth a prefix-cache snapshot (e.g. the end of the system part)
    boundaries: tuple[int, ...] = ()
    # mlx-lm's (tokens, logits) -> logits at each verified position (never mirrored)
    logits_processors: tuple = ()


@dataclass
class BlockEvent:
    """One verified block, as plain Python data."""

    tokens: list[int]
    from_draft: int  # leading tokens that were the drafter's
    block_size: int  # tokens the target verified
    first: bool  # the prefill's token (no verify step)
    finish_reason: str | None  # "stop" (EOS), "length" or None
    logprobs: list | None  # per token: (logprob, [(token_id, logprob), ...])
    prompt_tokens: int
    reused_tokens: int
    prompt_tps: float
    generation_tps: float
    elapsed: float  # seconds since the job was submitted
    source: str | None = None  # what proposed the block: "draft", "lookup", "splice"


@dataclass(frozen=True)
class Prefilled:
    """Progress of a job's prefill: `done` of its `total` prompt tokens are in (the
    prefix cache's included); one after every chunk but the last."""

    done: int
    total: int


@dataclass
class Finished:
    """The job ended: "done" (finish_reason reached) or "cancelled"."""

    reason: str


@dataclass
class Failed:
    """The job ended with an error the client should see."""

    status: int
    message: str
    code: str


class QueueFull(Exception):
    """Every active slot and the waiting queue are taken."""


class ShuttingDown(Exception):
    """The server is stopping and takes no new jobs."""


class Ticket:
    """The HTTP side's handle on a job: its events, in order, and a cancel switch."""

    def __init__(self, job: Job, loop: asyncio.AbstractEventLoop, timeout: float):
        self.job = job
        self.submitted = time.monotonic()
        self.deadline = self.submitted + timeout
        self._loop = loop
        self._events: asyncio.Queue = asyncio.Queue()
        self._cancel = threading.Event()

    def cancel(self):
        """Stop the job at its next turn (no-op once it has ended)."""
        self._cancel.set()

    @property
    def cancelled(self) -> bool:
        return self._cancel.is_set()

    async def next_event(self, timeout: float | None = None):
        """The next event; raises TimeoutError after `timeout` seconds without one."""
        return await asyncio.wait_for(self._events.get(), timeout)

    def send(self, event):
        """Called from the engine thread."""
        try:
            self._loop.call_soon_threadsafe(self._events.put_nowait, event)
        except RuntimeError:  # the event loop is gone: nobody is listening
            self.cancel()


class Scheduler:
    """Owns the engine; runs jobs on one thread."""

    def __init__(
        self,
        engine,
        *,
        max_concurrency: int = 4,
        max_queue: int = 16,
        timeout: float = 600.0,
        mirror=None,
        max_kv_bytes: int = 0,
    ):
        if max_concurrency < 1 or max_queue < 0 or timeout <= 0:
            raise ValueError(
                "max_concurrency must be >= 1, max_queue >= 0 and timeout > 0; got "
                f"{max_concurrency}, {max_queue}, {timeout}."
            )
        self.engine = engine
        self.max_concurrency, self.timeout = max_concurrency, timeout
        self._waiting: queue.Queue = queue.Queue()  # bounded by submit
        self._max_queue = max_queue
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.active = 0  # jobs being worked on (written by the engine thread only)
        self.mirror = mirror  # a sharded target: every move is told to the other ranks
        self._tickets: dict[int, Ticket] = {}
        self.max_kv_bytes = max_kv_bytes  # the decoding caches' budget (0: none)
        self._held: Ticket | None = None  # admitted next, once the budget allows
        self._keys = 0
        self._prefill_turn = True

    # -- HTTP side -----------------------------------------------------------------
    @property
    def waiting(self) -> int:
        return self._waiting.qsize() + (self._held is not None)

    def submit(self, job: Job, loop: asyncio.AbstractEventLoop) -> Ticket:
        """Queue `job`; raises QueueFull or ShuttingDown instead of blocking."""
        if self._stop.is_set() or self._thread is None:
            raise ShuttingDown("The server is shutting down.")
        ticket = Ticket(job, loop, self.timeout)
        room = self._max_queue + max(0, self.max_concurrency - self.active)
        if self.waiting >= room:
            raise QueueFull(
                f"{self.active} requests are generating and {self.waiting} are waiting "
                f"(--max-concurrency {self.max_concurrency}, --max-queue "
                f"{self._max_queue}): retry shortly."
            )
        self._waiting.put_nowait(ticket)
        return ticket

    @property
    def stopping(self) -> bool:
        """Shutting down: the dashboard's streams end too."""
        return self._stop.is_set()

    def start(self):
        self._thread = threading.Thread(
            target=self._loop, name="dflash-engine", daemon=True
        )
        self._thread.start()

    def shutdown(self):
        """End every job with an error event and stop (non-blocking)."""
        self._stop.set()

    def stop(self, timeout: float = 30.0):
        self.shutdown()
        if self._thread is not None:
            self._thread.join(timeout)

    # -- engine thread -------------------------------------------------------------
    def _loop(self):
        import mlx.core as mx

        try:
            self._serve_jobs()
        finally:
            if self.mirror is not None:
                self.mirror.stop()
            # MLX needs a thread's streams destroyed before the thread ends, or the
            # process can abort at exit ("terminate called without an active exception")
            mx.clear_streams()

    def _serve_jobs(self):
        busy, idle_since = False, None
        while not self._stop.is_set():
            self._admit_waiting()
            self._expire()
            self.active = len(self._tickets)
            if not self._tickets:
                if busy:
                    idle_since = time.monotonic()
                elif idle_since and time.monotonic() - idle_since > IDLE_TRIM_S:
                    self._on_idle()
                    idle_since = None
                busy = False
                if self.mirror is not None:
                    self.mirror.idle()
                continue
            busy = True
            self._turn()
        self._fail_everything()

    def _turn(self):
        """One prefill chunk or one decoding step, alternating while both wait."""
        engine = self.engine
        prefilling = [s for s in engine.sequences.values() if s.prefilling]
        decoding = len(engine.decoding) > 0
        if prefilling and (self._prefill_turn or not decoding):
            self._prefill(prefilling[0])
        elif decoding:
            self._step()
        self._prefill_turn = not self._prefill_turn

    def _admit_waiting(self):
        while len(self._tickets) < self.max_concurrency:
            ticket, self._held = self._held, None
            try:  # wait a little only when there is nothing else to do
                ticket = ticket or self._waiting.get(
                    block=not self._tickets, timeout=0.1
                )
            except queue.Empty:
                return
            if self._tickets and not self.engine.fits(ticket.job, self.max_kv_bytes):
                self._held = ticket  # it waits for memory: the next to go in
                return
            if ticket.cancelled:
                ticket.send(Finished("cancelled"))
            elif time.monotonic() > ticket.deadline:
                ticket.send(self.timeout_failure())
            else:
                self._admit(ticket)

    def _admit(self, ticket: Ticket):
        key, self._keys = self._keys, self._keys + 1
        try:
            seq = self.engine.admit(key, ticket.job)
            if self.mirror is not None:
                self.mirror.admit(key, ticket.job, seq.reused)
        except Exception as e:  # a bad job must not stop the engine
            log.exception("could not start a generation")
            ticket.send(Failed(500, f"Generation failed: {e}", "generation_error"))
            return
        self._tickets[key] = ticket

    def _expire(self):
        now = time.monotonic()
        for key, ticket in list(self._tickets.items()):
            if ticket.cancelled:
                self._end(key, Finished("cancelled"))
            elif now > ticket.deadline:
                self._end(key, self.timeout_failure())

    def _prefill(self, seq):
        try:
            if self.mirror is not None:
                self.mirror.prefill(seq.key)
            block = self.engine.prefill(seq)
        except Exception as e:
            log.exception("prefill failed")
            failure = Failed(500, f"Generation failed: {e}", "generation_error")
            self._end(seq.key, failure, keep=False)
            return
        if block is not None:
            self._deliver(seq, block, first=True)
        else:  # for the stream's keep-alives: one plain event a chunk
            total = len(seq.job.prompt)
            self._tickets[seq.key].send(Prefilled(total - len(seq.todo), total))

    def _step(self):
        try:
            if self.mirror is not None:
                self.mirror.step()
            blocks = self.engine.step()
        except Exception as e:  # the decoding caches are in an unknown state
            log.exception("generation failed")
            failure = Failed(500, f"Generation failed: {e}", "generation_error")
            failed = [s.key for s in self.engine.sequences.values() if not s.prefilling]
            self.engine.drop_decoding()
            for key in failed:
                self._end(key, failure, keep=False)
            return
        for seq, block in blocks:
            self._deliver(seq, block)

    def _deliver(self, seq, block, first: bool = False):
        ticket = self._tickets[seq.key]
        reason = None
        if block.finished:
            reason = "stop"
        elif seq.produced >= seq.job.max_tokens:
            reason = "length"
        event = _block_event(seq, block, ticket, reason, first)
        if reason is None:
            ticket.send(event)
        else:
            self._end(seq.key, Finished("done"), last_block=event)

    def _end(self, key: int, event, keep: bool = True, last_block=None):
        """End job `key` and free its slot, then send its last events: a client that
        answers at once (a follow-up turn, /health) finds its prefix cached."""
        ticket = self._tickets.pop(key)
        try:
            if key in self.engine.sequences:
                evicted = self.engine.end(key, keep)
                if self.mirror is not None:
                    self.mirror.end(key, keep, evicted)
        except Exception:
            log.exception("ending a generation failed")
        self.active = len(self._tickets)
        if last_block is not None:
            ticket.send(last_block)
        ticket.send(event)

    def timeout_failure(self) -> Failed:
        return Failed(
            504,
            f"The request ran past the server's timeout ({self.timeout:g} s, "
            "--request-timeout): ask for fewer tokens or raise the timeout.",
            "timeout",
        )

    def _on_idle(self):
        import mlx.core as mx

        from .. import heap

        # give freed buffers back once nothing has run for a while (an agent's next
        # request, seconds later, still finds them)
        mx.clear_cache()
        heap.give_back()

    def _fail_everything(self):
        failure = Failed(503, "The server is shutting down.", "server_shutting_down")
        for key in list(self._tickets):
            self._end(key, failure)
        if self._held is not None:
            self._held.send(failure)
        while True:
            try:
                self._waiting.get_nowait().send(failure)
            except queue.Empty:
                break
        self.active = 0
        try:
            self.engine.close()
        except Exception:
            log.exception("could not keep the prompt cache on disk")


def _block_event(seq, block, ticket: Ticket, reason: str | None, first: bool):
    now = time.perf_counter()
    prompt = len(seq.job.prompt)
    return BlockEvent(
        tokens=list(block.tokens),
        from_draft=block.from_draft,
        block_size=block.block_size,
        first=first,
        finish_reason=reason,
        logprobs=block.logprobs,
        prompt_tokens=prompt,
        reused_tokens=seq.reused,
        prompt_tps=(prompt - seq.reused) / max(seq.prefill_seconds, 1e-9),
        generation_tps=seq.produced / max(now - seq.decode_start, 1e-9),
        elapsed=time.monotonic() - ticket.submitted,
        source=block.source,
    )
