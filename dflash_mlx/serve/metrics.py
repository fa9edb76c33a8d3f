"""Prometheus metrics for GET /metrics, in a registry of the app's own (no globals),
and what the dashboard reads beside them: the requests in flight and the last ones
finished, and the tokens committed per second over the last minutes."""

import time
import weakref
from collections import deque
from functools import partial

_TTFT_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
_TPS_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000)
SERIES_S = 300  # seconds of per-second token counts the dashboard plots
RECENT = 20  # finished requests the dashboard lists


def sample_key(name: str, labels: dict) -> str:
    """A sample as /metrics writes it: `name` or `name{a="x",b="y"}` (sorted)."""
    if not labels:
        return name
    inner = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    return f"{name}{{{inner}}}"


def _memory(read):
    """MLX's allocator count `read` ("active" or "peak"), in bytes."""
    import mlx.core as mx

    return getattr(mx, f"get_{read}_memory")()


class _PrefillCounters:
    """The engine's running prefill totals as counters, read when scraped (their
    rate's quotient is the prefill throughput)."""

    def __init__(self, engine):
        self.engine = engine

    def collect(self):
        from prometheus_client.core import CounterMetricFamily

        engine = self.engine
        yield CounterMetricFamily(
            "dflash_prefill_tokens",
            "Prompt tokens prefilled (those served from the prefix cache not counted).",
            value=engine.prefill_tokens,
        )
        yield CounterMetricFamily(
            "dflash_prefill_seconds",
            "Seconds spent prefilling prompts (prefix-cache snapshots included).",
            value=engine.prefill_seconds,
        )


class Metrics:
    """Requests, tokens, acceptance lengths, queue depth, TTFT, decode tok/s, prefill
    tokens and seconds; the dashboard's requests and per-second token counts."""

    def __init__(self, scheduler, max_block: int):
        from prometheus_client import CollectorRegistry, Counter, Histogram

        self._dashboard()
        r = self.registry = CollectorRegistry()
        self.requests = Counter(
            "dflash_requests",
            "Requests by endpoint and outcome.",
            ["endpoint", "status"],
            registry=r,
        )
        self.prompt_tokens = Counter(
            "dflash_prompt_tokens", "Prompt tokens of served requests.", registry=r
        )
        self.cached_tokens = Counter(
            "dflash_cached_prompt_tokens",
            "Prompt tokens served from the prompt cache.",
            registry=r,
        )
        self.generated_tokens = Counter(
            "dflash_generated_tokens", "Tokens generated.", registry=r
        )
        self.acceptance = Histogram(
            "dflash_acceptance_length",
            "Tokens committed per verify step (tau).",
            buckets=list(range(1, max(max_block, 1) + 1)),
            registry=r,
        )
        # per source of the verified proposals: the drafter, prompt lookup, a splice
        # of both, or none ("plain": a decoding step)
        self.source_blocks = Counter(
            "dflash_blocks_by_source",
            "Verify steps by what proposed their tokens: draft, lookup, splice, plain.",
            ["source"],
            registry=r,
        )
        self.source_tokens = Counter(
            "dflash_tokens_by_source",
            "Tokens committed by verify steps, by what proposed them.",
            ["source"],
            registry=r,
        )
        self.ttft = Histogram(
            "dflash_time_to_first_token_seconds",
            "Seconds from a request's arrival to its first token (queueing included).",
            buckets=_TTFT_BUCKETS,
            registry=r,
        )
        self.decode = Histogram(
            "dflash_decode_tokens_per_second",
            "Per-request decode speed after the first token.",
            buckets=_TPS_BUCKETS,
            registry=r,
        )
        self._load(scheduler, r)
        self._prefix_cache(scheduler.engine, r)
        r.register(_PrefillCounters(scheduler.engine))

    def _dashboard(self) -> None:
        """What the dashboard lists (requests in flight, by number; the last finished)
        and plots ([second, tokens, blocks with proposals, plain blocks] for each
        second with blocks); `version` moves with every block, start and end."""
        self.live: weakref.WeakValueDictionary = weakref.WeakValueDictionary()
        self.recent: deque = deque(maxlen=RECENT)
        self.series: deque = deque(maxlen=SERIES_S)
        self.version = 0
        self._numbers = 0

    @staticmethod
    def _load(scheduler, registry):
        """Gauges of the requests in the engine and of MLX's memory, read when
        scraped."""
        from prometheus_client import Gauge

        def gauge(name: str, text: str, read):
            Gauge(name, text, registry=registry).set_function(read)

        gauge(
            "dflash_queue_depth",
            "Requests waiting for a slot.",
            lambda: scheduler.waiting,
        )
        gauge(
            "dflash_active_requests",
            "Requests generating now.",
            lambda: scheduler.active,
        )
        gauge(
            "dflash_batch_width",
            "Requests decoding together now.",
            lambda: len(scheduler.engine.decoding),
        )
        for read in ("active", "peak"):
            gauge(
                f"dflash_mlx_{read}_memory_bytes",
                f"MLX's {read} memory (its allocator's count), in bytes.",
                partial(_memory, read),
            )

    @staticmethod
    def _prefix_cache(engine, registry):
        """Gauges read from the prefix cache's own counts when scraped."""
        from prometheus_client import Gauge

        def gauge(name: str, text: str, read):
            Gauge(name, text, registry=registry).set_function(read)

        store = engine.store
        stats = store.stats
        gauge(
            "dflash_prefix_cache_hits",
            "Requests served a cached prefix.",
            lambda: stats.hits,
        )
        gauge(
            "dflash_prefix_cache_misses",
            "Requests with no cached prefix.",
            lambda: stats.misses,
        )
        gauge(
            "dflash_prefix_cache_reused_tokens",
            "Prompt tokens served from it.",
            lambda: stats.reused_tokens,
        )
        gauge(
            "dflash_prefix_cache_evictions",
            "Prefixes dropped from RAM.",
            lambda: stats.evicted,
        )
        gauge(
            "dflash_prefix_cache_bytes",
            "Bytes the prefix cache holds in RAM.",
            lambda: store.nbytes,
        )
        gauge(
            "dflash_prefix_cache_disk_bytes",
            "Bytes it holds on disk.",
            lambda: store.spill.nbytes if store.spill else 0,
        )
        gauge(
            "dflash_prefix_snapshot_seconds",
            "Seconds spent taking snapshots.",
            lambda: engine.snapshot_seconds,
        )
        gauge(
            "dflash_decoding_kv_bytes",
            "Bytes of the decoding batch's caches.",
            lambda: engine.kv_bytes,
        )

    def count(self, endpoint: str, status: str):
        self.requests.labels(endpoint, status).inc()

    def observe_start(self, generation):
        """A request submitted: listed by the dashboard until it ends."""
        self._numbers += 1
        generation.number = self._numbers
        self.live[self._numbers] = generation
        self.version += 1

    def observe_block(self, event):
        self.version += 1
        if event.first:
            self.ttft.observe(event.elapsed)
            return
        n = len(event.tokens)
        self.acceptance.observe(n)
        source = getattr(event, "source", None) or "plain"
        self.source_blocks.labels(source).inc()
        self.source_tokens.labels(source).inc(n)
        second = int(time.monotonic())
        if not self.series or self.series[-1][0] != second:
            self.series.append([second, 0, 0, 0])
        row = self.series[-1]
        row[1] += n
        row[3 if source == "plain" else 2] += 1

    def observe_end(self, endpoint: str, status: str, generation):
        self.count(endpoint, status)
        stats = generation.stats
        self.prompt_tokens.inc(stats.prompt_tokens)
        self.cached_tokens.inc(stats.cached_tokens)
        self.generated_tokens.inc(generation.completion_tokens)
        if stats.verify_steps:
            self.decode.observe(stats.decode_tps)
        number = getattr(generation, "number", None)
        if number is not None and self.live.pop(number, None) is not None:
            self.recent.append(generation.record(status))
        self.version += 1

    def samples(self) -> dict[str, float]:
        """Every sample /metrics shows but the histograms' buckets, keyed as it
        writes them (`sample_key`): the dashboard's numbers are these."""
        out = {}
        for family in self.registry.collect():
            for s in family.samples:
                if not s.name.endswith(("_bucket", "_created")):
                    out[sample_key(s.name, s.labels)] = s.value
        return out

    def tokens_per_second(self, seconds: int = SERIES_S) -> tuple[int, list, list]:
        """(now's second, tokens committed in each of the last `seconds` seconds,
        oldest first, and [blocks with proposals, plain blocks] in each)."""
        now = int(time.monotonic())
        tokens, blocks = [0] * seconds, [[0, 0] for _ in range(seconds)]
        for second, n, proposed, plain in list(self.series):
            i = seconds - 1 - (now - second)
            if 0 <= i < seconds:
                tokens[i], blocks[i] = n, [proposed, plain]
        return now, tokens, blocks

    def render(self) -> tuple[bytes, str]:
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        return generate_latest(self.registry), CONTENT_TYPE_LATEST
