"""`dflash-mlx bench`: plain mlx-lm decoding vs DFlash on bundled or custom prompts."""

import json
from dataclasses import dataclass, field
from pathlib import Path

import typer

from . import options


@dataclass
class BenchOptions:
    dataset: str
    model: str | None = None
    draft: str | None = None
    max_samples: int | None = None
    max_tokens: int = 256
    block_size: str | None = None
    temp: float = 0.0
    thinking: bool = False
    seed: int = 42
    json_out: Path | None = None
    plot: Path | None = None
    engines: list[str] = field(default_factory=list)
    pipeline: bool = False
    lookup: bool | None = None  # prompt lookup (None: with --block-size auto)


def resolve_models(model: str | None, draft: str | None) -> tuple[str, str]:
    """Target and drafter: as given, else the built-in pair or the drafter registry."""
    from dflash_mlx.loading.resolve import resolve_models as resolve

    model, draft, _ = resolve(model, draft)
    if draft is None:
        raise ValueError(
            f"No DFlash drafter known for '{model}': pass --draft <folder or Hub id> "
            "(the benchmark compares plain decoding with DFlash)."
        )
    return str(model), str(draft)


def _engines(opts: BenchOptions, model, draft, tokenizer, ids: tuple[str, str]) -> dict:
    from mlx_lm.sample_utils import make_sampler

    from dflash_mlx import bench
    from dflash_mlx.loading import DRAFT_FILES, TARGET_FILES
    from dflash_mlx.loading.hub import resolve_path

    engines = {
        bench.BASELINE: bench.mlx_lm_engine(model, tokenizer, make_sampler(opts.temp)),
        "dflash": bench.dflash_engine(
            model, draft, tokenizer, opts.temp, lookup=opts.lookup
        ),
    }
    for name in opts.engines:
        if name == bench.PLAIN:
            engines[name] = bench.plain_engine(model, tokenizer, opts.temp)
        if name == "reference":
            if ids[0].endswith(".gguf"):
                raise ValueError(
                    "--engine reference loads targets with mlx-lm only: pass a "
                    "model folder or Hub id, not a .gguf file."
                )
            engines["reference"] = bench.reference_engine(
                resolve_path(ids[0], TARGET_FILES, "Target model"),
                resolve_path(ids[1], DRAFT_FILES, "Drafter"),
                opts.temp,
            )
    return engines


def _check_outputs(opts: BenchOptions):
    """--json and --plot must be writable (and --plot drawable) before the run."""
    from dflash_mlx import files

    if opts.json_out is not None:
        opts.json_out = files.check_writable(opts.json_out, "--json")
    if opts.plot is not None:
        opts.plot = files.check_writable(opts.plot, "--plot")
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise ValueError(
                "--plot needs matplotlib: pip install 'mlx-dflash[plot]'."
            ) from None


def _config(opts: BenchOptions):
    """The library's BenchConfig for these options (block sizes filled in later);
    every option is checked here, before any model loads."""
    from dflash_mlx import bench, validate

    if opts.max_samples is not None and opts.max_samples < 1:
        raise ValueError(f"--max-samples must be at least 1, got {opts.max_samples}.")
    validate.finite("--temp", opts.temp)
    if opts.temp < 0:
        raise ValueError(f"--temp must be >= 0, got {opts.temp}.")
    if opts.max_tokens < 1:
        raise ValueError(f"--max-tokens must be at least 1, got {opts.max_tokens}.")
    validate.seed(opts.seed)
    unknown = [e for e in opts.engines if e not in ("dflash", "reference", "plain")]
    if unknown:
        raise ValueError(
            f"Unknown --engine '{unknown[0]}': the choices are dflash, plain and "
            "reference."
        )
    _check_outputs(opts)
    return bench.BenchConfig(
        datasets=[opts.dataset],
        block_sizes=bench.parse_block_sizes(opts.block_size) or [],
        max_samples=opts.max_samples,
        max_tokens=opts.max_tokens,
        temperature=opts.temp,
        thinking=opts.thinking,
        seed=opts.seed,
    )


def _measure(
    out, ui, tokenizer, engines, samples, config, referee=None
) -> tuple[list, bool]:
    """Every record, with a progress bar; (records, interrupted by Ctrl-C). At
    temperature 0, `referee` classifies each difference from plain decoding."""
    from dflash_mlx import bench

    records, tally = [], bench.Tally()
    with ui.progress(out) as bar:
        task = bar.add_task(
            "warm-up", total=bench.count_turns(samples), speedup=ui.speedup_text(None)
        )
        try:
            for turn in bench.run(tokenizer, engines, samples, config, referee):
                records.extend(turn)
                tally.add(turn)
                bar.update(
                    task,
                    advance=1,
                    description=turn[0].dataset,
                    speedup=ui.speedup_text(tally.speedup()),
                )
        except KeyboardInterrupt:
            return records, True
    return records, False


def _write(out, ui, opts: BenchOptions, config, env, records, summary) -> bool:
    """The --json report and the --plot PNG, where asked for, each written atomically;
    False if one could not be written (said on `out`)."""
    from dflash_mlx import bench, files

    ok = True
    try:
        if opts.json_out is not None:
            report = bench.report(config, env, records, summary)
            files.write_text(opts.json_out, json.dumps(report, indent=1))
            ui.note(out, f"wrote {opts.json_out}")
        if opts.plot is not None:
            with files.atomic_path(opts.plot) as tmp:
                bench.write_plot(records, summary, tmp)
            ui.note(out, f"wrote {opts.plot}")
    except (OSError, ValueError) as e:
        ui.error(out, f"{e}: the results are in the summary line below.")
        ok = False
    return ok


def execute(opts: BenchOptions, out=None, engines: dict | None = None) -> int:
    """Run the benchmark and render it; the exit code (non-zero on a losslessness
    failure). Bad options exit 2 before any model loads; later errors exit 1.

    `engines` replaces engines by name (tests pass a deliberately wrong one)."""
    from dflash_mlx import bench

    from . import bench_ui as ui
    from . import errors
    from .ranks import join

    out = out or ui.console()
    with errors.usage(ui.console(stderr=True)):
        config = _config(opts)
        samples = bench.load_samples(config)
        config.datasets = list(samples)
        ids = resolve_models(opts.model, opts.draft)
        group = join(opts.pipeline)
        if group is not None and "reference" in opts.engines:
            raise ValueError("--engine reference runs on one process: drop it here.")
    with errors.runtime(ui.console(stderr=True)):
        return _execute(out, ui, opts, config, samples, ids, engines, group)


def _execute(out, ui, opts, config, samples, ids, engines, group) -> int:
    from dflash_mlx import bench, load, load_draft

    from .ranks import describe
    from .session import warn_without_compiler

    warn_without_compiler()
    if group is not None:
        import mlx.core as mx

        mx.random.seed(opts.seed)  # mlx-lm's sampled baseline draws alike on all ranks
    ui.loading(out, f"target {ids[0]}")
    model, tokenizer = load(ids[0], distributed=group)
    ui.loading(out, f"drafter {ids[1]}")
    draft = load_draft(ids[1], target=model, distributed=group)
    config.block_sizes = _block_sizes(out, ui, config.block_sizes, draft, opts)
    all_engines = _engines(opts, model, draft, tokenizer, ids)
    all_engines.update(engines or {})
    env = bench.environment(model, draft, *ids)
    env["distributed"] = describe(group)
    ui.environment(out, env)

    records, interrupted = _measure(
        out, ui, tokenizer, all_engines, samples, config, _referee(model, tokenizer)
    )
    if interrupted:
        ui.error(
            out, f"interrupted: summarising the {len(records)} runs measured so far."
        )
    summary = bench.summarize(records)
    summary["interrupted"] = interrupted
    ui.results(out, summary, config.temperature)
    if not summary["lossless"]:
        ui.lossless_failure(out, summary["failures"])
    if summary["near_ties"]:
        ui.near_ties(out, summary["near_ties"])
    written = True
    if group is None or group.is_main:  # one rank writes the files
        written = _write(out, ui, opts, config, env, records, summary)
    out.file.flush()
    typer.echo(json.dumps(bench.compact(summary), separators=(",", ":")))
    if not summary["lossless"] or not written:
        return 1
    return 130 if interrupted else 0


def _referee(model, tokenizer):
    """The target's logits and plain decoding for a prompt: what tells a near-tie
    from a mismatch (dflash_mlx/engine/exactness.py)."""
    from dflash_mlx.engine.exactness import referee

    return lambda ids: referee(model, tokenizer, ids)


def _block_sizes(out, ui, sizes: list, draft, opts: BenchOptions) -> list:
    """The sizes to measure: auto by default (the reference has no auto, so it also
    gets the drafter's size); fixed sizes capped at the drafter's, with a note."""
    from dflash_mlx import validate

    largest = draft.args.block_size
    if not sizes:
        return ["auto", largest] if "reference" in opts.engines else ["auto"]
    capped = []
    for size in sizes:
        if size != "auto":
            size, note = validate.block_size(size, largest)
            if note:
                ui.note(out, note)
        capped.append(size)
    return list(dict.fromkeys(capped))


def bench(
    dataset: str = typer.Option(
        ...,
        "--dataset",
        "-d",
        help="gsm8k, math500, humaneval, mbpp, mt-bench, code-edits, all (the "
        "first five), a comma list, or a .jsonl file of prompts/turns.",
    ),
    model: str | None = options.model(help="Target: Hub id or folder."),
    draft: str | None = options.draft(
        "--draft", help="DFlash drafter: Hub id or folder."
    ),
    max_samples: int | None = typer.Option(
        None, "--max-samples", "-n", help="Prompts per dataset (default: all)."
    ),
    max_tokens: int = typer.Option(256, "--max-tokens", help="New tokens per answer."),
    block_size: str | None = typer.Option(
        None,
        "--block-size",
        "-b",
        help="16, auto, or a sweep like 4,8,16,auto (default: auto).",
    ),
    temp: float = typer.Option(
        0.0, "--temp", help="Sampling temperature (0 = greedy, checked lossless)."
    ),
    thinking: bool = typer.Option(
        False, "--thinking", help="enable_thinking in the chat template."
    ),
    seed: int = typer.Option(
        42, "--seed", help="Sample draw (42 = the reference's) and sampling seed."
    ),
    json_out: Path | None = typer.Option(
        None, "--json", help="Write every record + summary here."
    ),
    plot: Path | None = typer.Option(
        None, "--plot", help="Write a PNG (needs matplotlib: the plot extra)."
    ),
    engine: list[str] = typer.Option(
        [],
        "--engine",
        help="Also measure: plain (this package's plain decoding, as --no-draft "
        "runs) or reference (the dflash package).",
    ),
    pipeline: bool = options.pipeline(),
    lookup: bool | None = options.lookup(),
):
    """Measure plain mlx-lm decoding against DFlash, prompt by prompt; check it is
    lossless."""

    opts = BenchOptions(
        dataset,
        model,
        draft,
        max_samples,
        max_tokens,
        block_size,
        temp,
        thinking,
        seed,
        json_out,
        plot,
        list(engine),
        pipeline,
        lookup,
    )
    raise typer.Exit(execute(opts))
