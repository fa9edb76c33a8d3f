"""One request on the HTTP side: checks its limits, submits it to the engine, and turns
the engine's block events into `Delta`s, usage and DFlash statistics."""

import asyncio
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

from ..structured import DEAD_END
from .errors import ApiError
from .scheduler import Failed, Finished, Job, Prefilled, QueueFull, ShuttingDown
from .textstream import Delta, TextStream

RETRY_AFTER_S = 1
CHECK_EVERY_S = 0.25  # how often a non-streaming request checks its client is there
# a stream waiting for its first token (queued or prefilling) gets a keep-alive at most
# once a second while its prefill moves on, and at least once in KEEPALIVE_IDLE_S
KEEPALIVE_S = 1.0
KEEPALIVE_IDLE_S = 3.0


class ClientGone(Exception):
    """The client disconnected while its response was being generated."""


@dataclass(frozen=True)
class Waiting:
    """A keep-alive is due: `done` of the prompt's `total` tokens are in (the prefix
    cache's included); `total` is 0 while the request waits for a slot or its first
    chunk."""

    done: int = 0
    total: int = 0

    def comment(self) -> str:
        """As an SSE comment's text (OpenAI and Responses streams)."""
        return f"prefill {self.done}/{self.total}" if self.total else "keep-alive"


@dataclass(frozen=True)
class Sampling:
    """A request's generation options; None means the server's default."""

    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    seed: int | None = None
    stop: tuple[str, ...] = ()
    logprobs: int = 0  # alternatives per token (0 = no logprobs)
    # logits processors (penalties, logit_bias, a grammar): serve/constraints.py
    processors: tuple = ()


@dataclass
class RequestStats:
    """Usage and the `x_dflash` numbers of one request."""

    prompt_tokens: int = 0
    cached_tokens: int = 0
    verify_steps: int = 0
    committed: int = 0  # tokens those steps committed
    drafted: int = 0  # drafts the target verified
    accepted: int = 0  # drafts it accepted
    block_sizes: Counter = field(default_factory=Counter)
    # verify steps and the tokens they committed, by what proposed them: "draft",
    # "lookup" (copied), "splice" (a copy, then drafts) or "plain" (nothing)
    source_blocks: Counter = field(default_factory=Counter)
    source_tokens: Counter = field(default_factory=Counter)
    last_source: str | None = None  # the last verify step's
    last_block_size: int | None = None
    ttft_s: float | None = None
    prompt_tps: float = 0.0
    decode_tps: float = 0.0

    def add(self, event):
        if event.first:
            self.prompt_tokens, self.cached_tokens = (
                event.prompt_tokens,
                event.reused_tokens,
            )
            self.ttft_s, self.prompt_tps = event.elapsed, event.prompt_tps
        else:
            self.verify_steps += 1
            self.committed += len(event.tokens)
            self.drafted += event.block_size - 1
            self.accepted += event.from_draft
            self.block_sizes[event.block_size] += 1
            source = getattr(event, "source", None) or "plain"
            self.source_blocks[source] += 1
            self.source_tokens[source] += len(event.tokens)
            self.last_source, self.last_block_size = source, event.block_size
        self.decode_tps = event.generation_tps

    def x_dflash(self, draft: str | None) -> dict:
        steps = self.verify_steps
        return {
            "draft": draft,
            "mean_tau": self.committed / steps if steps else None,
            "verify_steps": steps,
            "drafted_tokens": self.drafted,
            "accepted_tokens": self.accepted,
            "acceptance_rate": self.accepted / self.drafted if self.drafted else None,
            "block_sizes": {str(k): v for k, v in sorted(self.block_sizes.items())},
            "blocks_by_source": dict(sorted(self.source_blocks.items())),
            "tokens_by_source": dict(sorted(self.source_tokens.items())),
            "ttft_s": self.ttft_s,
            "prompt_tps": self.prompt_tps,
            "decode_tps": self.decode_tps,
        }


class Generation:
    """A submitted request; iterate `deltas()` (streams) or await `collect()`."""

    def __init__(self, state, ticket, text: TextStream, endpoint: str):
        self.state, self.ticket, self.text = state, ticket, text
        self.endpoint = endpoint
        self.stats = RequestStats()
        self.request_id: str | None = None  # the response's id, once the route has it
        self.number: int | None = None  # the dashboard's (metrics.observe_start)
        self.started = time.monotonic()
        # "eos", "length", "stop" (a stop string) or "grammar" (a grammar's dead end)
        self.finish: str | None = None
        self.processors: tuple = ()  # the request's logits processors
        self.prompt = None  # the chat prompt, when the answer may be resent
        self.content = ""  # the answer as the client got it
        self._checked = time.monotonic()
        self._keepalive = False  # yield Waiting while the first token is awaited
        self._quiet_since = self._checked  # when the stream last sent something
        self._progress, self._told = Waiting(), Waiting()

    @property
    def completion_tokens(self) -> int:
        return len(self.text.tokens)

    @property
    def stop_sequence(self) -> str | None:
        return self.text.stop_hit

    def usage(self) -> dict:
        s = self.stats
        return {
            "prompt_tokens": s.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": s.prompt_tokens + self.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": s.cached_tokens},
        }

    def x_dflash(self) -> dict:
        return self.stats.x_dflash(self.state.config.draft_id)

    def record(self, status: str | None = None) -> dict:
        """The request as the dashboard lists it: its usage and `x_dflash` numbers
        (the same values its response carries), and where it is. `status`: how it
        ended (metrics' request status); None while it runs."""
        s, now = self.stats, time.monotonic()
        if status is not None:
            where = status
        elif s.ttft_s is not None:
            where = "decoding"
        elif self._progress.total:
            where = "prefilling"
        else:
            where = "waiting"
        return {
            "number": self.number,
            "id": self.request_id,
            "endpoint": self.endpoint,
            "state": where,
            "finish": self.finish,
            "seconds": now - self.started,
            "prefill": [self._progress.done, self._progress.total],
            "prompt_tokens": s.prompt_tokens,
            "cached_tokens": s.cached_tokens,
            "completion_tokens": self.completion_tokens,
            "last_source": s.last_source,
            "last_block_size": s.last_block_size,
            **self.x_dflash(),
        }

    async def deltas(
        self,
        disconnected: Callable[[], Awaitable[bool]] | None = None,
        keepalive: bool = False,
    ) -> AsyncIterator[Delta | Waiting]:
        """Output as it is generated; raises ApiError if generation fails. With
        `keepalive` (streams), a `Waiting` now and then until the first token."""
        status = "cancelled"
        self._keepalive, self._quiet_since = keepalive, time.monotonic()
        try:
            while self.finish is None:
                event = await self._next_event(disconnected)
                if isinstance(event, Prefilled):
                    self._progress = Waiting(event.done, event.total)
                    continue
                if isinstance(event, Waiting):
                    yield event
                    continue
                if isinstance(event, Failed):
                    raise ApiError(event.status, event.message, code=event.code)
                if isinstance(event, Finished):  # ended without a finish reason
                    self.finish = "length"
                    break
                self.stats.add(event)
                self.state.metrics.observe_block(event)
                delta = self.text.feed(
                    event.tokens, event.logprobs, event.finish_reason == "stop"
                )
                if self.text.stop_hit is not None:
                    self.finish = "stop"
                elif event.finish_reason is not None:
                    self.finish = "eos" if event.finish_reason == "stop" else "length"
                    if self.finish == "eos" and self._dead_end():
                        self.finish = DEAD_END
                if self.finish is not None:
                    self.ticket.cancel()  # a stop string: no more blocks needed
                    delta.extend(self.text.finish())
                self.content += delta.content
                if delta:
                    yield delta
            status = "ok"
            self._keep_for_next_turn()
        except ApiError as e:
            status, e.counted = e.metric_status, True
            raise
        except ClientGone:
            raise
        except Exception:
            status = "error"
            raise
        finally:
            self.ticket.cancel()  # client gone or error: free the engine slot
            self.state.metrics.observe_end(self.endpoint, status, self)

    def _dead_end(self) -> bool:
        """Whether a grammar ended the answer for want of any token it allows."""
        return any(getattr(p, "dead_end", False) for p in self.processors)

    def _keep_for_next_turn(self):
        """The answer's ids, for when the client resends it as text: only a plain
        answer (no reasoning, tool call or stop string cut out of it)."""
        text, prompt = self.text, self.prompt
        if prompt is None or not prompt.text or text.made_tool_call:
            return
        if self.finish not in ("eos", "length") or text.saw_reasoning:
            return
        tokens = text.tokens[:-1] if self.finish == "eos" else text.tokens
        self.state.history.record(prompt.text, prompt.ids, self.content, tokens)

    async def collect(self, disconnected=None) -> Delta:
        """The whole output (non-streaming responses)."""
        total = Delta()
        async for delta in self.deltas(disconnected):
            assert isinstance(delta, Delta)  # no keep-alives asked for
            total.extend(delta)
        return total

    def _keepalive_due(self, now: float) -> Waiting | None:
        """A keep-alive, when one is due (streams, before the first token)."""
        if not self._keepalive or self.stats.ttft_s is not None:
            return None
        quiet = now - self._quiet_since
        moved = self._progress != self._told
        if quiet < KEEPALIVE_IDLE_S and not (moved and quiet >= KEEPALIVE_S):
            return None
        self._quiet_since, self._told = now, self._progress
        return self._progress

    async def _next_event(self, disconnected):
        # The engine times out running jobs itself; this also covers a queued one.
        while True:
            now = time.monotonic()
            if disconnected is not None and now - self._checked >= CHECK_EVERY_S:
                self._checked = now  # a client that gave up: stop at the next block
                if await disconnected():
                    raise ClientGone
            waiting = self._keepalive_due(now)
            if waiting is not None:
                return waiting
            left = self.ticket.deadline - now + 1.0
            if left <= 0:
                failure = self.state.scheduler.timeout_failure()
                raise ApiError(failure.status, failure.message, code=failure.code)
            try:
                return await self.ticket.next_event(min(left, CHECK_EVERY_S))
            except asyncio.TimeoutError:
                continue


def make_job(state, ids: list[int], sampling: Sampling, boundary: int = 0) -> Job:
    """The engine job for `ids`, with the server's defaults and limits applied."""
    cfg = state.config
    if not ids:
        raise ApiError(400, "The prompt is empty: send some text.", param="prompt")
    context = state.context_length
    if context is not None and len(ids) >= context:
        raise ApiError(
            400,
            f"The prompt is {len(ids)} tokens but the model's context window is "
            f"{context}: shorten the conversation, or serve a model with a longer "
            "context (an agent such as Claude Code sends ~20K tokens at the start).",
            param="messages",
            code="context_length_exceeded",
        )
    # agents ask for more than a local model gives (Claude Code: 32K-64K): clamped to
    # the server's cap and the context left; the answer ends with a length finish
    max_tokens = min(sampling.max_tokens or cfg.max_tokens, cfg.max_tokens)
    if context is not None:
        max_tokens = min(max_tokens, context - len(ids))
    pick = lambda value, default: default if value is None else value  # noqa: E731
    return Job(
        prompt=tuple(ids),
        max_tokens=max_tokens,
        temperature=pick(sampling.temperature, cfg.temperature),
        top_p=pick(sampling.top_p, cfg.top_p),
        top_k=pick(sampling.top_k, cfg.top_k),
        min_p=pick(sampling.min_p, cfg.min_p),
        seed=sampling.seed,
        logprobs=sampling.logprobs,
        boundaries=(boundary,) if boundary else (),
        logits_processors=sampling.processors,
    )


def start(
    state,
    ids: list[int],
    sampling: Sampling,
    endpoint: str,
    *,
    tools=None,
    initial_state: str = "normal",
    raw: bool = False,
    prompt=None,
) -> Generation:
    """Validate and submit a request; 503 with Retry-After when the queue is full.

    `raw` (text completions) turns off the reasoning/tool-call split; `prompt` (a
    chat request's prompting.ChatPrompt) lets the answer be kept for the next turn."""
    job = make_job(state, ids, sampling, prompt.boundary if prompt else 0)
    try:
        ticket = state.scheduler.submit(job, asyncio.get_running_loop())
    except (QueueFull, ShuttingDown) as e:
        raise ApiError(
            503,
            str(e),
            code="server_overloaded",
            headers={"Retry-After": str(RETRY_AFTER_S)},
        ) from None
    text = TextStream(
        state.tokenizer,
        state.raw_output if raw else state.output,
        stop=sampling.stop,
        tools=tools,
        initial_state=initial_state,
    )
    generation = Generation(state, ticket, text, endpoint)
    generation.prompt, generation.processors = prompt, sampling.processors
    state.metrics.observe_start(generation)
    return generation
