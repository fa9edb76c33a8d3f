"""Rich rendering for `dflash-mlx train`: a bar per stage, τ checks, summary."""

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
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


class _Bars:
    """One progress bar at a time: a stage's bar replaces the one before."""

    def __init__(self, out: Console):
        self.out = out
        self.progress: Progress | None = None
        self.task: TaskID | None = None

    def close(self):
        if self.progress is not None:
            self.progress.stop()
        self.progress, self.task = None, None

    def update(self, name: str, total: int, done: int, **fields):
        if self.progress is None:
            self.progress = _bar(self.out)
            self.progress.start()
            self.task = self.progress.add_task(
                name, total=total, completed=done, info=""
            )
        if self.task is not None:
            self.progress.update(self.task, **fields)

    def print(self, text: str):
        (self.progress.console if self.progress else self.out).print(text)


def _finished(out: Console, ev, opts):
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


def _show(ev, bars: _Bars, opts):
    """Draw one training event."""
    from dflash_mlx.train import Finished, SaveEvent, Stage, StepEvent, ValEvent
    from dflash_mlx.train.data import DataProgress
    from dflash_mlx.train.features import FeatureProgress

    if isinstance(ev, Stage):
        bars.close()
        bars.out.print(f"[bold cyan]{ev.name}[/] {ev.detail}")
    elif isinstance(ev, DataProgress):
        info = f"{ev.new_tokens} new tokens"
        bars.update("responses", ev.total, ev.done, completed=ev.done, info=info)
    elif isinstance(ev, FeatureProgress):
        bars.update("features", ev.total, ev.done, completed=ev.done)
    elif isinstance(ev, StepEvent):
        info = (
            f"loss {ev.loss:.3f} acc {ev.accuracy:.2f} lr {ev.lr:.1e} "
            f"{ev.tokens_per_s:,.0f} tok/s eta {ev.eta / 60:.0f} min"
        )
        bars.update("train", ev.total, ev.step - 1, completed=ev.step, info=info)
    elif isinstance(ev, ValEvent):
        bars.print(
            f"step {ev.step}: τ = [bold green]{ev.tau:.2f}[/] on {ev.prompts} "
            "held-out prompts"
        )
    elif isinstance(ev, SaveEvent):
        bars.print(f"[dim]checkpoint {ev.path}[/]")
    elif isinstance(ev, Finished):
        bars.close()
        _finished(bars.out, ev, opts)


def render(opts):
    """Run the training pipeline, drawing its events."""
    from dflash_mlx.train import run

    bars = _Bars(console())
    try:
        for ev in run(opts):
            _show(ev, bars, opts)
    finally:
        bars.close()
