"""Summaries of measured records: one row per (dataset, engine, block size), the
one-line JSON, the full `--json` report, and the running speedup shown while it runs.
Each row says what proposed its tokens (`sources`: the drafter, prompt lookup, a splice
of both, or nothing) and, when `--engine plain` ran, its speedup over this package's
own plain decoding."""

import statistics
from collections.abc import Iterable
from dataclasses import asdict

from .engines import BASELINE, PLAIN
from .measure import BenchConfig, Record

SCHEMA = "dflash-mlx/bench/1"


def _tps(records: list[Record]) -> float:
    """Decode tok/s as the reference computes it: 1 / mean time per output token."""
    tpots = [
        r.decode_s / (r.tokens - 1) for r in records if r.tokens > 1 and r.decode_s > 0
    ]
    return 1.0 / statistics.fmean(tpots) if tpots else 0.0


def _histogram(taus: list[int], bins: int) -> list[float]:
    """Share of blocks that committed 1, 2, … `bins` tokens."""
    if not taus:
        return [0.0] * bins
    return [sum(t == i for t in taus) / len(taus) for i in range(1, bins + 1)]


def by_source(runs: list[Record]) -> dict:
    """Per source ("draft", "lookup", "splice", "plain" for none): verify steps,
    tokens committed and per step, share of all tokens, and the share of its
    proposals accepted."""
    steps = [
        (source or "plain", tau, proposed, taken)
        for r in runs
        for source, tau, proposed, taken in zip(
            r.sources, r.accept_lengths, r.proposed, r.taken, strict=False
        )
    ]
    total = sum(step[1] for step in steps) or 1
    out = {}
    for name in sorted({step[0] for step in steps}):
        mine = [step for step in steps if step[0] == name]
        tokens, proposed = sum(m[1] for m in mine), sum(m[2] for m in mine)
        out[name] = dict(
            steps=len(mine),
            tokens=tokens,
            mean_tau=tokens / len(mine),
            token_share=tokens / total,
            proposed=proposed,
            acceptance=sum(m[3] for m in mine) / proposed if proposed else None,
        )
    return out


def _row(
    dataset: str,
    engine: str,
    bs,
    base: list[Record],
    runs: list[Record],
    plain: list[Record],
) -> dict:
    taus = [t for r in runs for t in r.accept_lengths]
    bins = bs if isinstance(bs, int) else max(taus, default=1)  # auto: the longest
    per_prompt = [r.mean_tau for r in runs if r.mean_tau is not None]
    base_tps, tps, plain_tps = _tps(base), _tps(runs), _tps(plain)
    return dict(
        dataset=dataset,
        engine=engine,
        block_size=bs,
        prompts=len(runs),
        tokens=sum(r.tokens for r in runs),
        baseline_tps=base_tps,
        tps=tps,
        speedup=tps / base_tps if base_tps else 0.0,
        mean_tau=statistics.fmean(per_prompt) if per_prompt else None,
        tau_histogram=_histogram(taus, bins),
        baseline_ttft_s=statistics.fmean(r.ttft_s for r in base) if base else 0.0,
        ttft_s=statistics.fmean(r.ttft_s for r in runs) if runs else 0.0,
        peak_memory_gb=max((r.peak_memory_gb for r in runs), default=0.0),
        baseline_peak_memory_gb=max((r.peak_memory_gb for r in base), default=0.0),
        lossless_failures=sum(r.lossless is False for r in runs),
        near_ties=sum(_verdict(r) == "near_tie" for r in runs),
        sources=by_source(runs),
        plain_tps=plain_tps or None,
        speedup_vs_plain=tps / plain_tps if plain_tps else None,
    )


def _verdict(r: Record) -> str | None:
    return (r.exactness or {}).get("verdict")


def _failure(r: Record) -> dict:
    return dict(
        dataset=r.dataset,
        sample=r.sample,
        turn=r.turn,
        engine=r.engine,
        block_size=r.block_size,
        first_mismatch=r.first_mismatch,
        exactness=r.exactness,
    )


def summarize(records: list[Record]) -> dict:
    """One row per (dataset, engine, block size), plus an `all` row per (engine, block
    size) when there are several datasets; `lossless` is False if any output
    mismatched plain decoding (`failures`); outputs that differ only at near-ties
    (engine/exactness.py) are listed in `near_ties`."""
    datasets = list(dict.fromkeys(r.dataset for r in records))
    keys = list(
        dict.fromkeys((r.engine, r.block_size) for r in records if r.engine != BASELINE)
    )
    groups = [(d, [r for r in records if r.dataset == d]) for d in datasets]
    if len(datasets) > 1:
        groups.append(("all", records))
    rows = []
    for d, rs in groups:
        base = [r for r in rs if r.engine == BASELINE]
        plain = [r for r in rs if r.engine == PLAIN]
        for engine, bs in keys:
            runs = [r for r in rs if r.engine == engine and r.block_size == bs]
            rows.append(_row(d, engine, bs, base, runs, plain))
    failures = [_failure(r) for r in records if r.lossless is False]
    ties = [_failure(r) for r in records if _verdict(r) == "near_tie"]
    checked = any(r.lossless is not None for r in records)
    return dict(
        rows=rows,
        lossless=not failures,
        lossless_checked=checked,
        failures=failures,
        near_ties=ties,
    )


def _round3(x):
    return None if x is None else round(x, 3)


def compact(summary: dict) -> dict:
    """The one-line summary: lossless flag and, per row, the headline numbers."""
    return dict(
        lossless=summary["lossless"],
        failures=len(summary["failures"]),
        near_ties=len(summary.get("near_ties", ())),
        rows=[
            dict(
                dataset=r["dataset"],
                engine=r["engine"],
                block_size=r["block_size"],
                baseline_tps=_round3(r["baseline_tps"]),
                tps=_round3(r["tps"]),
                speedup=_round3(r["speedup"]),
                tau=_round3(r["mean_tau"]),
                speedup_vs_plain=_round3(r.get("speedup_vs_plain")),
            )
            for r in summary["rows"]
        ],
    )


def report(
    config: BenchConfig, environment: dict, records: list[Record], summary: dict
) -> dict:
    """Everything `--json` writes."""
    return dict(
        schema=SCHEMA,
        config=asdict(config),
        environment=environment,
        records=[r.to_dict() for r in records],
        summary=summary,
    )


class Tally:
    """Running speedup while the benchmark runs (best block size of the main engine)."""

    def __init__(self, engine: str = "dflash"):
        self.engine = engine
        self.base: list[Record] = []
        self.runs: dict[int | str, list[Record]] = {}

    def add(self, records: Iterable[Record]):
        for r in records:
            if r.engine == BASELINE:
                self.base.append(r)
            elif r.engine == self.engine:
                self.runs.setdefault(r.block_size, []).append(r)

    def speedup(self) -> tuple[float, int | str] | None:
        base = _tps(self.base)
        if not base or not self.runs:
            return None
        return max((_tps(rs) / base, bs) for bs, rs in self.runs.items())
