"""Prometheus metrics for GET /metrics, in a registry of the app's own (no globals)."""

_TTFT_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
_TPS_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000)


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
    tokens and seconds."""

    def __init__(self, scheduler, max_block: int):
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

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
        Gauge(
            "dflash_queue_depth", "Requests waiting for a slot.", registry=r
        ).set_function(lambda: scheduler.waiting)
        Gauge(
            "dflash_active_requests", "Requests generating now.", registry=r
        ).set_function(lambda: scheduler.active)
        self._prefix_cache(scheduler.engine, r)
        r.register(_PrefillCounters(scheduler.engine))

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

    def observe_block(self, event):
        if event.first:
            self.ttft.observe(event.elapsed)
        else:
            self.acceptance.observe(len(event.tokens))
            source = getattr(event, "source", None) or "plain"
            self.source_blocks.labels(source).inc()
            self.source_tokens.labels(source).inc(len(event.tokens))

    def observe_end(self, endpoint: str, status: str, generation):
        self.count(endpoint, status)
        stats = generation.stats
        self.prompt_tokens.inc(stats.prompt_tokens)
        self.cached_tokens.inc(stats.cached_tokens)
        self.generated_tokens.inc(generation.completion_tokens)
        if stats.verify_steps:
            self.decode.observe(stats.decode_tps)

    def render(self) -> tuple[bytes, str]:
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        return generate_latest(self.registry), CONTENT_TYPE_LATEST
