"""Benchmark library half: measure plain mlx-lm decoding against DFlash on the same prompts,
check losslessness at temperature 0, and summarise. Nothing here prints; the CLI renders.

An engine is a callable `engine(prompt_ids, max_tokens, block_size)` that yields
`(tokens, accepted)` per step (`accepted` = acceptance length, None for the prefill token).
Engines are injectable, so tests can pass a deliberately wrong one.
"""

import statistics
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field

import mlx.core as mx

from .datasets import Sample, load_dataset, resolve

Engine = Callable[[list[int], int, int], Iterable[tuple[list[int], int | None]]]
SCHEMA = "dflash-mlx/bench/1"
BASELINE = "baseline"


@dataclass
class BenchConfig:
    datasets: list[str]
    block_sizes: list[int]
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
    engine: str  # "baseline" (plain mlx-lm), "dflash", "reference"
    block_size: int
    prompt_tokens: int
    tokens: int
    ttft_s: float  # time to the first token (prefill + first sample)
    decode_s: float  # time from the first token to the last
    decode_tps: float  # (tokens - 1) / decode_s
    accept_lengths: list[int] = field(default_factory=list)
    peak_memory_gb: float = 0.0
    lossless: bool | None = None  # same tokens as the baseline (temperature 0 only)
    first_mismatch: int | None = None  # index of the first differing token
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
    """`--block-size` value: "16", "4,8,16" or "8,auto" → [16] / [4, 8, 16] / [8, "auto"];
    None stays None. "auto" picks the size per block from measured speed."""
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
    if not sizes or any(s != "auto" and s < 2 for s in sizes):
        raise ValueError(
            f"Block sizes must be >= 2 (1 is plain decoding, the baseline), got '{text}'."
        )
    return list(dict.fromkeys(sizes))


# --- engines ---------------------------------------------------------------------------


def mlx_lm_engine(model, tokenizer, sampler) -> Engine:
    """Plain decoding with mlx-lm's own `stream_generate`: what users run without DFlash."""
    from mlx_lm import stream_generate as lm_stream_generate

    def run(ids, max_tokens, block_size):
        for r in lm_stream_generate(
            model, tokenizer, ids, max_tokens=max_tokens, sampler=sampler
        ):
            yield [r.token], None

    return run


def dflash_engine(
    model, draft, tokenizer, temperature=0.0, top_p=1.0, top_k=0
) -> Engine:
    """This package's `stream_generate`."""
    from .adaptive import AdaptiveBlockSize
    from .generate import stream_generate
    from .target import Target

    target = Target(model, draft.args.target_layer_ids)
    auto = AdaptiveBlockSize(
        draft.args.block_size
    )  # learns across prompts, as in a chat

    def run(ids, max_tokens, block_size):
        policy = auto if block_size == "auto" else block_size
        for r in stream_generate(
            target,
            draft,
            tokenizer,
            ids,
            block_size=policy,
            max_tokens=max_tokens,
            temperature=temperature,
            top_p=top_p,
            top_k=top_k,
        ):
            yield r.tokens, r.accepted

    return run


def reference_config(args):
    """The reference package's `DFlashConfig` for our drafter `ModelArgs`."""
    import dataclasses

    from dflash import model_mlx as ref

    values = {
        f.name: getattr(args, f.name)
        for f in dataclasses.fields(ref.DFlashConfig)
        if hasattr(args, f.name)
    }
    values.update(
        target_layer_ids=tuple(args.target_layer_ids),
        layer_types=tuple(args.layer_types),
    )
    return ref.DFlashConfig(**values)


def reference_engine(
    target_dir, draft_dir, temperature=0.0, top_p=1.0, top_k=0
) -> Engine:
    """The reference `dflash.model_mlx` engine on its own copy of the target (it wraps layers)."""
    try:
        from dflash import model_mlx as ref
    except ImportError as e:
        raise ValueError(
            "--engine reference needs the reference package: "
            "pip install --no-deps dflash==0.1.0"
        ) from e
    import json
    from pathlib import Path

    from .draft import ModelArgs

    model, tokenizer = ref.load(str(target_dir))
    args = ModelArgs.from_config(
        json.loads((Path(draft_dir) / "config.json").read_text())
    )
    v2 = args.architecture == "DFlash2DraftModel"
    draft = (ref.DFlash2DraftModel if v2 else ref.DFlashDraftModel)(
        reference_config(args)
    )
    weights = {
        k: v
        for f in sorted(Path(draft_dir).glob("*.safetensors"))
        for k, v in mx.load(str(f)).items()
    }
    for key in (
        "candidate_selector.predecessor_codebook",
        "candidate_selector.successor_codebook",
    ):
        if key in weights:  # the reference keeps these as Embedding layers
            weights[f"{key}.weight"] = weights.pop(key)
    draft.load_weights(list(weights.items()))
    draft.eval()
    mx.eval(draft.parameters())

    def run(ids, max_tokens, block_size):
        for r in ref.stream_generate(
            model,
            draft,
            tokenizer,
            ids,
            block_size=block_size,
            max_tokens=max_tokens,
            temperature=temperature,
            top_p=top_p,
            top_k=top_k,
        ):
            yield r.tokens, r.accepted

    return run


# --- measuring -------------------------------------------------------------------------


def measure(engine: Engine, ids: list[int], max_tokens: int, block_size: int) -> dict:
    """Run one generation; timings are taken here, the same way for every engine."""
    mx.reset_peak_memory()
    tokens, taus, first, n_first = [], [], None, 0
    start = time.perf_counter()
    for step_tokens, accepted in engine(ids, max_tokens, block_size):
        if first is None:
            first, n_first = time.perf_counter(), len(step_tokens)
        tokens.extend(int(t) for t in step_tokens)
        if accepted is not None:
            taus.append(int(accepted))
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
        peak_memory_gb=mx.get_peak_memory() / 1e9,
        output=tokens,
    )


def chat_ids(tokenizer, messages: list[dict], thinking: bool) -> list[int]:
    """Prompt ids through the model's chat template (`enable_thinking` where it has one)."""
    from .generate import encode_prompt

    template = getattr(tokenizer, "chat_template", None)
    if not template:
        if thinking:
            raise ValueError(
                "--thinking needs a chat template; this tokenizer has none."
            )
        return encode_prompt(tokenizer, "\n\n".join(m["content"] for m in messages))
    kwargs = {}
    if "enable_thinking" in str(template):
        kwargs["enable_thinking"] = thinking
    elif thinking:
        raise ValueError(
            "This model's chat template has no thinking switch (enable_thinking): "
            "drop --thinking."
        )
    text = tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True, **kwargs
    )
    return encode_prompt(tokenizer, text)


def load_samples(config: BenchConfig) -> dict[str, list[Sample]]:
    """Every requested dataset, drawn with the config's seed and sample limit."""
    return {
        name: load_dataset(name, config.max_samples, config.seed)
        for name in resolve(",".join(config.datasets))
    }


def count_turns(samples: dict[str, list[Sample]]) -> int:
    return sum(len(s.turns) for items in samples.values() for s in items)


def _slots(engines: dict[str, Engine], block_sizes: list[int]) -> list[tuple[str, int]]:
    # "auto" is this package's adaptive block size; the reference has no such mode
    return [(BASELINE, 1)] + [
        (n, b)
        for b in block_sizes
        for n in engines
        if n != BASELINE and not (b == "auto" and n == "reference")
    ]


def warmup(engines: dict[str, Engine], ids: list[int], config: BenchConfig):
    """One short generation per (engine, block size): compiles kernels, sizes buffers."""
    for name, bs in _slots(engines, config.block_sizes):
        for _ in engines[name](
            ids, max(1, min(config.warmup_tokens, config.max_tokens)), bs
        ):
            pass


def run(
    tokenizer,
    engines: dict[str, Engine],
    samples: dict[str, list[Sample]],
    config: BenchConfig,
) -> Iterator[list[Record]]:
    """Measure every prompt turn under the baseline and each (engine, block size).

    Yields the records of one turn at a time. The order of the runs rotates from one turn
    to the next, so neither mode always runs first. At temperature 0 each engine's tokens
    are compared with the baseline's (`Record.lossless`). In multi-turn sets the baseline's
    answer goes back into the history.
    """
    if BASELINE not in engines:
        raise ValueError(f"engines must include '{BASELINE}' (plain decoding).")
    if config.max_tokens < 1:
        raise ValueError(f"--max-tokens must be at least 1, got {config.max_tokens}.")
    slots = _slots(engines, config.block_sizes)
    first = next((s for items in samples.values() for s in items), None)
    if first is None:
        return
    warmup(
        engines,
        chat_ids(
            tokenizer, [{"role": "user", "content": first.turns[0]}], config.thinking
        ),
        config,
    )
    k = 0
    for items in samples.values():
        for sample in items:
            messages = []
            for turn, content in enumerate(sample.turns):
                messages.append({"role": "user", "content": content})
                ids = chat_ids(tokenizer, messages, config.thinking)
                order = slots[k % len(slots) :] + slots[: k % len(slots)]
                k += 1
                results = {}
                for name, bs in order:
                    if config.temperature > 0:
                        mx.random.seed(config.seed + k)
                    results[(name, bs)] = measure(
                        engines[name], ids, config.max_tokens, bs
                    )
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
                _check(records, config.temperature)
                yield records
                answer = _strip_stop(records[0].output, tokenizer)
                messages.append(
                    {
                        "role": "assistant",
                        "content": tokenizer.decode(answer, skip_special_tokens=True),
                    }
                )


def _strip_stop(tokens: list[int], tokenizer) -> list[int]:
    stop = set(getattr(tokenizer, "eos_token_ids", None) or [])
    return tokens[:-1] if tokens and tokens[-1] in stop else tokens


def _check(records: list[Record], temperature: float):
    base = records[0].output
    for r in records[1:]:
        if temperature > 0:
            continue
        r.lossless = r.output == base
        if not r.lossless:
            r.first_mismatch = next(
                (i for i, (a, b) in enumerate(zip(r.output, base)) if a != b),
                min(len(r.output), len(base)),
            )


# --- summary ---------------------------------------------------------------------------


def _tps(records: list[Record]) -> float:
    """Decode tok/s as the reference computes it: 1 / mean time per output token."""
    tpots = [
        r.decode_s / (r.tokens - 1) for r in records if r.tokens > 1 and r.decode_s > 0
    ]
    return 1.0 / statistics.fmean(tpots) if tpots else 0.0


def _row(
    dataset: str, engine: str, bs: int, base: list[Record], runs: list[Record]
) -> dict:
    taus = [t for r in runs for t in r.accept_lengths]
    bins = (
        bs if isinstance(bs, int) else max(taus, default=1)
    )  # "auto": up to the longest
    hist = [
        sum(t == i for t in taus) / len(taus) if taus else 0.0
        for i in range(1, bins + 1)
    ]
    per_prompt = [r.mean_tau for r in runs if r.mean_tau is not None]
    base_tps, tps = _tps(base), _tps(runs)
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
        tau_histogram=hist,
        baseline_ttft_s=statistics.fmean(r.ttft_s for r in base) if base else 0.0,
        ttft_s=statistics.fmean(r.ttft_s for r in runs) if runs else 0.0,
        peak_memory_gb=max((r.peak_memory_gb for r in runs), default=0.0),
        baseline_peak_memory_gb=max((r.peak_memory_gb for r in base), default=0.0),
        lossless_failures=sum(r.lossless is False for r in runs),
    )


def summarize(records: list[Record]) -> dict:
    """One row per (dataset, engine, block size), plus an `all` row per (engine, block size)
    when there are several datasets; `lossless` is False if any output differed."""
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
        for engine, bs in keys:
            runs = [r for r in rs if r.engine == engine and r.block_size == bs]
            rows.append(_row(d, engine, bs, base, runs))
    failures = [
        dict(
            dataset=r.dataset,
            sample=r.sample,
            turn=r.turn,
            engine=r.engine,
            block_size=r.block_size,
            first_mismatch=r.first_mismatch,
        )
        for r in records
        if r.lossless is False
    ]
    checked = any(r.lossless is not None for r in records)
    return dict(
        rows=rows, lossless=not failures, lossless_checked=checked, failures=failures
    )


def compact(summary: dict) -> dict:
    """The one-line summary: lossless flag and, per row, the headline numbers."""

    def r3(x):
        return None if x is None else round(x, 3)

    return dict(
        lossless=summary["lossless"],
        failures=len(summary["failures"]),
        rows=[
            dict(
                dataset=r["dataset"],
                engine=r["engine"],
                block_size=r["block_size"],
                baseline_tps=r3(r["baseline_tps"]),
                tps=r3(r["tps"]),
                speedup=r3(r["speedup"]),
                tau=r3(r["mean_tau"]),
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
        self.engine, self.base, self.runs = engine, [], {}

    def add(self, records: Iterable[Record]):
        for r in records:
            if r.engine == BASELINE:
                self.base.append(r)
            elif r.engine == self.engine:
                self.runs.setdefault(r.block_size, []).append(r)

    def speedup(self) -> tuple[float, int] | None:
        base = _tps(self.base)
        if not base or not self.runs:
            return None
        return max((_tps(rs) / base, bs) for bs, rs in self.runs.items())


# --- environment -----------------------------------------------------------------------


def detect_blas() -> str:
    """Which BLAS MLX's CPU backend runs on, e.g. 'OpenBLAS (/usr/lib/...)'."""
    import sys

    from .blas import blas_in_use

    if sys.platform == "darwin":
        return "Accelerate/Metal"
    info = blas_in_use()
    name = info["name"]
    label = (
        "reference BLAS (slow)"
        if name.startswith("reference BLAS")
        else name
        if info["fast"]
        else f"{name} (slow)"
    )
    return f"{label} ({info['path']})" if info["path"] else label


def _cpu_name() -> str:
    import platform
    import subprocess
    import sys

    if sys.platform.startswith("linux"):
        try:
            with open("/proc/cpuinfo") as f:
                for line in f:
                    if line.startswith("model name"):
                        return line.split(":", 1)[1].strip()
        except OSError:
            pass
    if sys.platform == "darwin":
        try:
            return subprocess.run(
                ["sysctl", "-n", "machdep.cpu.brand_string"],
                capture_output=True,
                text=True,
                timeout=5,
            ).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            pass
    return platform.processor() or platform.machine()


def describe_weights(model) -> str:
    """'4-bit (group 64)' for quantized models, else the weights' dtype."""
    import mlx.nn as nn
    from mlx.utils import tree_flatten

    quant = [
        m
        for _, m in model.named_modules()
        if hasattr(m, "bits") and hasattr(m, "group_size") and isinstance(m, nn.Module)
    ]
    if quant:
        bits = "/".join(str(b) for b in sorted({m.bits for m in quant}))
        groups = "/".join(str(g) for g in sorted({m.group_size for m in quant}))
        return f"{bits}-bit (group {groups})"
    dtypes = {
        str(v.dtype).replace("mlx.core.", "")
        for _, v in tree_flatten(model.parameters())
    }
    return "none (" + "/".join(sorted(dtypes)) + ")"


def environment(model=None, draft=None, model_id: str = "", draft_id: str = "") -> dict:
    """Machine, chip/CPU, MLX device and BLAS, versions, models and their weights."""
    import os
    import platform
    from importlib.metadata import PackageNotFoundError, version

    def ver(pkg):
        try:
            return version(pkg)
        except PackageNotFoundError:
            return None

    chip = None
    if mx.default_device().type == mx.gpu:
        try:
            info = (
                mx.device_info()
                if hasattr(mx, "device_info")
                else mx.metal.device_info()
            )
            chip = info.get("device_name") or info.get("architecture")
        except Exception:  # noqa: BLE001 - best effort description only
            chip = None
    env = dict(
        platform=platform.platform(),
        machine=platform.machine(),
        cpu=_cpu_name(),
        cpu_count=os.cpu_count(),
        chip=chip,
        device=str(mx.default_device()),
        blas=detect_blas(),
        python=platform.python_version(),
        mlx=ver("mlx"),
        mlx_lm=ver("mlx-lm"),
        dflash_mlx=ver("dflash-mlx"),
        model=model_id,
        draft=draft_id,
    )
    if ver("dflash"):
        env["dflash_reference"] = ver("dflash")
    if model is not None:
        env["model_type"] = getattr(getattr(model, "args", None), "model_type", None)
        env["model_weights"] = describe_weights(model)
    if draft is not None:
        env["draft_weights"] = describe_weights(draft)
        env["draft_layers"] = draft.args.num_hidden_layers
        env["draft_block_size"] = draft.args.block_size
    return env


# --- plot ------------------------------------------------------------------------------


def write_plot(records: list[Record], summary: dict, path) -> None:
    """A PNG: acceptance-length histograms and decode tok/s per prompt for each mode."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise ValueError(
            "--plot needs matplotlib: pip install 'dflash-mlx[plot]'."
        ) from e
    rows = [r for r in summary["rows"] if r["dataset"] == "all"] or summary["rows"]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 4.5))
    width = 0.8 / max(len(rows), 1)
    for i, row in enumerate(rows):
        xs = [
            t + 1 + (i - (len(rows) - 1) / 2) * width for t in range(row["block_size"])
        ]
        ax1.bar(
            xs,
            [100 * h for h in row["tau_histogram"]],
            width,
            label=f"{row['dataset']} {row['engine']} B={row['block_size']}",
        )
    ax1.set(
        title="Acceptance length (tokens per target forward)",
        xlabel="tau",
        ylabel="% of blocks",
    )
    ax1.legend(fontsize=7)
    series = list(dict.fromkeys((r.engine, r.block_size) for r in records))
    for engine, bs in series:
        ys = [r.decode_tps for r in records if (r.engine, r.block_size) == (engine, bs)]
        ax2.plot(
            range(1, len(ys) + 1),
            ys,
            marker="o",
            ms=3,
            label="mlx-lm (plain)" if engine == BASELINE else f"{engine} B={bs}",
        )
    ax2.set(title="Decode speed per prompt", xlabel="prompt turn", ylabel="tok/s")
    ax2.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(str(path), dpi=120)
    plt.close(fig)
