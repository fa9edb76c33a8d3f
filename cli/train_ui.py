"""Rich rendering for `dflash-mlx train`: a bar per stage, τ checks, summary."""

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)


def console(stderr: bool = False) -> Console:
    return Console(stderr=stderr, highlight=False)


def error(out: Console, message: str):
    out.print(f"[bold red]Error:[/] {message}")


def interrupted(out: Console, folder):
    out.print(
        f"[yellow]Interrupted.[/] Progress is saved in {folder}: run the same command "
        "again to resume."
    )


def _bar(out: Console) -> Progress:
    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[info]}"),
        TimeElapsedColumn(),
        TextColumn("ETA"),
        TimeRemainingColumn(),
        console=out,
    )


def render(opts):
    """Run the training pipeline, drawing its events."""
    from dflash_mlx.train import Finished, SaveEvent, Stage, StepEvent, ValEvent, run
    from dflash_mlx.train.data import DataProgress
    from dflash_mlx.train.features import FeatureProgress

    out = console()
    progress, task = None, None

    def close():
        nonlocal progress, task
        if progress is not None:
            progress.stop()
        progress, task = None, None

    def bar(name, total, done):
        nonlocal progress, task
        if progress is None:
            progress = _bar(out)
            progress.start()
            task = progress.add_task(name, total=total, completed=done, info="")
        return progress

    try:
        for ev in run(opts):
            if isinstance(ev, Stage):
                close()
                out.print(f"[bold cyan]{ev.name}[/] {ev.detail}")
            elif isinstance(ev, DataProgress):
                bar("responses", ev.total, ev.done).update(
                    task, completed=ev.done, info=f"{ev.new_tokens} new tokens"
                )
            elif isinstance(ev, FeatureProgress):
                bar("features", ev.total, ev.done).update(task, completed=ev.done)
            elif isinstance(ev, StepEvent):
                bar("train", ev.total, ev.step - 1).update(
                    task,
                    completed=ev.step,
                    info=(
                        f"loss {ev.loss:.3f} acc {ev.accuracy:.2f} lr {ev.lr:.1e} "
                        f"{ev.tokens_per_s:,.0f} tok/s eta {ev.eta / 60:.0f} min"
                    ),
                )
            elif isinstance(ev, ValEvent):
                (progress.console if progress else out).print(
                    f"step {ev.step}: τ = [bold green]{ev.tau:.2f}[/] on {ev.prompts} "
                    "held-out prompts"
                )
            elif isinstance(ev, SaveEvent):
                (progress.console if progress else out).print(
                    f"[dim]checkpoint {ev.path}[/]"
                )
            elif isinstance(ev, Finished):
                close()
                tau = "–" if ev.tau is None else f"{ev.tau:.2f}"
                out.print(
                    f"[bold green]Drafter written to {ev.path}[/] ({ev.steps} steps, "
                    f"{ev.samples} samples, {ev.train_seconds / 60:.1f} min training, "
                    f"τ {tau})."
                )
                out.print(
                    f"Measure it: dflash-mlx bench -d gsm8k --model {opts.target} "
                    f"--draft {ev.path} -b 16"
                )
    finally:
        close()
