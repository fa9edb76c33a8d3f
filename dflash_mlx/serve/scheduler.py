"""The engine thread: the only code in the server that touches MLX.

HTTP handlers submit a `Job` (token ids and sampling options) and read plain-Python
events from their `Ticket`. Up to `max_concurrency` jobs are active at once and advance
one verified block each in turn (round-robin over their `stream_generate` generators,
each with its own `PromptCache` from the pool); the rest wait in a bounded queue. A
cancelled or timed-out job is closed at its next block: closing the generator rolls the
block in flight back, so its cache stays consistent and goes back to the pool.
"""

import asyncio
import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Generator
from dataclasses import dataclass

from ..models.cache import PromptCache

log = logging.getLogger("dflash_mlx.serve")


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
        """Stop the job at its next block (no-op once it has ended)."""
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


@dataclass
class _Run:
    ticket: Ticket
    cache: PromptCache
    gen: Generator  # stream_generate's
    number: int  # the run's id for the mirror


class Scheduler:
    """Owns the model, the drafter and the prompt pool; runs jobs on one thread."""

    def __init__(
        self,
        target,
        tokenizer,
        draft,
        pool,
        *,
        block_size="auto",
        max_concurrency: int = 4,
        max_queue: int = 16,
        timeout: float = 600.0,
        mirror=None,
    ):
        if max_concurrency < 1 or max_queue < 0 or timeout <= 0:
            raise ValueError(
                "max_concurrency must be >= 1, max_queue >= 0 and timeout > 0; got "
                f"{max_concurrency}, {max_queue}, {timeout}."
            )
        self.target, self.tokenizer, self.draft = target, tokenizer, draft
        self.pool = pool
        self.block_size = block_size
        self.max_concurrency, self.timeout = max_concurrency, timeout
        self._waiting: queue.Queue = queue.Queue()  # bounded by submit
        self._max_queue = max_queue
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.active = 0  # jobs generating now (written by the engine thread only)
        # a sharded target: every engine operation is first told to the other ranks
        self.mirror = mirror
        self._runs = 0

    # -- HTTP side -----------------------------------------------------------------
    @property
    def waiting(self) -> int:
        return self._waiting.qsize()

    def submit(self, job: Job, loop: asyncio.AbstractEventLoop) -> Ticket:
        """Queue `job`; raises QueueFull or ShuttingDown instead of blocking."""
        if self._stop.is_set() or self._thread is None:
            raise ShuttingDown("The server is shutting down.")
        ticket = Ticket(job, loop, self.timeout)
        # free active slots count as room too: the engine admits from the queue
        room = self._max_queue + max(0, self.max_concurrency - self.active)
        if self.waiting >= room:
            raise QueueFull(
                f"{self.active} requests are generating and {self.waiting} are waiting "
                f"(--max-concurrency {self.max_concurrency}, --max-queue "
                f"{self._max_queue}): retry shortly."
            )
        self._waiting.put_nowait(ticket)
        return ticket

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
        active: deque[_Run] = deque()
        busy = False
        while not self._stop.is_set():
            while len(active) < self.max_concurrency:
                try:  # wait a little only when there is nothing else to do
                    ticket = self._waiting.get(block=not active, timeout=0.1)
                except queue.Empty:
                    break
                run = self._admit(ticket)
                if run is not None:
                    active.append(run)
            self.active = len(active)
            if not active:
                if busy:
                    self._on_idle()
                busy = False
                if self.mirror is not None:
                    self.mirror.idle()
                continue
            busy = True
            run = active.popleft()
            if self._step(run):
                active.append(run)
            self.active = len(active)
        self._fail_everything(active)

    def _admit(self, ticket: Ticket) -> _Run | None:
        if ticket.cancelled:
            ticket.send(Finished("cancelled"))
            return None
        if time.monotonic() > ticket.deadline:
            ticket.send(self.timeout_failure())
            return None
        try:
            return self._start(ticket)
        except Exception as e:  # a bad job must not stop the engine
            log.exception("could not start a generation")
            ticket.send(Failed(500, f"Generation failed: {e}", "generation_error"))
            return None

    def _start(self, ticket: Ticket) -> _Run:
        job = ticket.job
        cache, pool_id = self.pool.take(job.prompt)
        number, self._runs = self._runs, self._runs + 1
        if self.mirror is not None:
            self.mirror.start(number, job, pool_id)
        return _Run(ticket, cache, start_generation(self, job, cache), number)

    def _step(self, run: _Run) -> bool:
        """Advance `run` by one block; False once it has ended."""
        ticket = run.ticket
        if ticket.cancelled:
            return self._end(run, Finished("cancelled"))
        if time.monotonic() > ticket.deadline:
            return self._end(run, self.timeout_failure())
        try:
            if self.mirror is not None:
                self.mirror.step(run.number)
            r = next(run.gen)
        except StopIteration:
            return self._end(run, Finished("done"))
        except ValueError as e:  # the engine's input checks: the request's fault
            failure = Failed(400, str(e), "invalid_request_error")
            return self._end(run, failure, keep_cache=False)
        except Exception as e:
            log.exception("generation failed")
            failure = Failed(500, f"Generation failed: {e}", "generation_error")
            return self._end(run, failure, keep_cache=False)
        block = _block_event(r, ticket)
        if r.finish_reason is not None:
            return self._end(run, Finished("done"), last_block=block)
        ticket.send(block)
        return True

    def _end(
        self,
        run: _Run,
        event,
        keep_cache: bool = True,
        last_block: BlockEvent | None = None,
    ) -> bool:
        """Close the generation and free its slot, then send its last events: a client
        that answers at once (a follow-up turn, /health) finds its cache in the pool."""
        kept, dropped = None, []
        try:
            run.gen.close()  # rolls back a block still in flight
        except Exception:
            log.exception("closing a generation failed")
            keep_cache = False
        if keep_cache:
            kept, dropped = self.pool.give_back(run.cache)
        if self.mirror is not None:
            self.mirror.end(run.number, kept, dropped)
        self.active = max(0, self.active - 1)
        if last_block is not None:
            run.ticket.send(last_block)
        run.ticket.send(event)
        return False

    def timeout_failure(self) -> Failed:
        return Failed(
            504,
            f"The request ran past the server's timeout ({self.timeout:g} s, "
            "--request-timeout): ask for fewer tokens or raise the timeout.",
            "timeout",
        )

    def _on_idle(self):
        import mlx.core as mx

        mx.clear_cache()  # give freed buffers back while nothing runs

    def _fail_everything(self, active: deque):
        failure = Failed(503, "The server is shutting down.", "server_shutting_down")
        for run in active:
            self._end(run, failure)
        while True:
            try:
                self._waiting.get_nowait().send(failure)
            except queue.Empty:
                break
        self.active = 0


def start_generation(scheduler: Scheduler, job: Job, cache: PromptCache) -> Generator:
    """`job`'s stream_generate on `cache` (follower ranks call it with the same job)."""
    from ..generate import stream_generate

    return stream_generate(
        scheduler.target,
        scheduler.draft,
        scheduler.tokenizer,
        list(job.prompt),
        block_size=scheduler.block_size,
        max_tokens=job.max_tokens,
        temperature=job.temperature,
        top_p=job.top_p,
        top_k=job.top_k,
        min_p=job.min_p,
        prompt_cache=cache,
        seed=job.seed,  # its own random keys: no cross-talk between requests
        logprobs=job.logprobs,
    )


def _block_event(r, ticket: Ticket) -> BlockEvent:
    return BlockEvent(
        tokens=list(r.tokens),
        from_draft=r.from_draft,
        block_size=r.block_size,
        first=r.accepted is None,
        finish_reason=r.finish_reason,
        logprobs=r.logprobs,  # already Python values
        prompt_tokens=r.prompt_tokens,
        reused_tokens=r.reused_tokens,
        prompt_tps=r.prompt_tps,
        generation_tps=r.generation_tps,
        elapsed=time.monotonic() - ticket.submitted,
    )
