"""Rich rendering for `dflash-mlx bench`: progress, tables, histograms, environment."""

from rich import box
from rich.console import Console, JustifyMethod
from rich.panel import Panel
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table
from rich.text import Text

SPARK = " ▁▂▃▄▅▆▇█"


def console(stderr: bool = False) -> Console:
    return Console(stderr=stderr, highlight=False)


def progress(out: Console) -> Progress:
    """Bar with ETA and the running speedup (field `speedup`)."""
    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[speedup]}"),
        TimeElapsedColumn(),
        TextColumn("ETA"),
        TimeRemainingColumn(),
        console=out,
        transient=True,
    )


def speedup_text(value: tuple[float, int] | None) -> str:
    return "speedup –" if value is None else f"speedup {value[0]:.2f}× (B={value[1]})"


def _f(x, spec: str) -> str:
    return "–" if x is None else format(x, spec)


def sparkline(hist: list[float]) -> str:
    """Acceptance histogram in one cell: a bar per tau = 1..B, scaled to the tallest."""
    top = max(hist, default=0.0)
    if top <= 0:
        return "–"
    return "".join(
        SPARK[max(1, round(h / top * (len(SPARK) - 1)))] if h > 0 else "·" for h in hist
    )


def histogram(row: dict, width: int = 30) -> Text:
    """Horizontal bar chart of the acceptance lengths of one summary row."""
    t = Text()
    t.append(
        f"acceptance lengths · {row['dataset']} · {row['engine']} · "
        f"B={row['block_size']}\n",
        style="bold",
    )
    hist = row["tau_histogram"]
    top = max(hist, default=0.0) or 1.0
    last = max((i for i, h in enumerate(hist) if h > 0), default=0)
    for tau, h in enumerate(hist[: last + 1], 1):
        t.append(f"  τ={tau:<3d}")
        t.append("█" * round(h / top * width), style="cyan")
        t.append(f" {100 * h:.1f}%\n" if h == 0 or h >= 0.001 else " <0.1%\n")
    return t


def summary_table(rows: list[dict]) -> Table:
    """One row per dataset and block size (and engine, when several are measured)."""
    engines = len({r["engine"] for r in rows}) > 1
    table = Table(
        title="decode speed (tok/s): plain mlx-lm vs DFlash",
        caption="n: prompt turns · τ: tokens per target forward · GB: peak memory · "
        "exact: same tokens as mlx-lm",
        caption_justify="left",
        title_justify="left",
        title_style="bold",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
        padding=(0, 1),
        collapse_padding=True,
    )
    columns: list[tuple[str, JustifyMethod]] = [
        ("dataset", "left"),
        ("engine", "left"),
        ("B", "right"),
        ("n", "right"),
        ("mlx-lm", "right"),
        ("DFlash", "right"),
        ("speedup", "right"),
        ("τ", "right"),
        ("τ = 1..B", "left"),
        ("GB", "right"),
        ("exact", "left"),
    ]
    for name, justify in columns:
        if name != "engine" or engines:
            table.add_column(name, justify=justify, no_wrap=True)
    for i, r in enumerate(rows):
        fails, ties = r["lossless_failures"], r.get("near_ties", 0)
        cells = [
            r["dataset"],
            r["engine"],
            str(r["block_size"]),
            str(r["prompts"]),
            _f(r["baseline_tps"], ".1f"),
            _f(r["tps"], ".1f"),
            Text(
                f"{r['speedup']:.2f}×", style="green" if r["speedup"] >= 1 else "yellow"
            ),
            _f(r["mean_tau"], ".2f"),
            Text(sparkline(r["tau_histogram"]), style="cyan"),
            _f(r["peak_memory_gb"], ".2f"),
            Text(f"FAIL {fails}", style="bold red")
            if fails
            else Text(f"ties {ties}", style="yellow")
            if ties
            else Text("ok", style="green"),
        ]
        if not engines:
            del cells[1]
        last_of_dataset = (
            i + 1 < len(rows) and rows[i + 1]["dataset"] == "all" != r["dataset"]
        )
        table.add_row(*cells, end_section=last_of_dataset)
    return table


def sources_text(row: dict) -> str:
    """Where a row's tokens came from, and its speedup over our plain decoding."""
    parts = []
    for name, s in row["sources"].items():
        taken = "" if s["acceptance"] is None else f", {s['acceptance']:.0%} taken"
        parts.append(f"{name} {s['token_share']:.0%} (τ {s['mean_tau']:.2f}{taken})")
    text = f"sources ({row['dataset']}, B={row['block_size']}): " + " · ".join(parts)
    if row.get("speedup_vs_plain"):
        text += f" · {row['speedup_vs_plain']:.2f}× our plain decoding"
    return text


def results(out: Console, summary: dict, temperature: float):
    rows = summary["rows"]
    out.print(summary_table(rows))
    overall = [r for r in rows if r["dataset"] == "all"] or rows
    for row in overall:
        out.print(
            Text(
                f"time to first token ({row['dataset']}, B={row['block_size']}): "
                "mlx-lm "
                f"{row['baseline_ttft_s'] * 1000:.0f} ms · {row['engine']} "
                f"{row['ttft_s'] * 1000:.0f} ms",
                style="dim",
            )
        )
    for row in rows:
        if row.get("sources") and row["engine"] != "plain":
            out.print(Text(sources_text(row), style="dim"))
    for row in overall:
        if row["mean_tau"] is not None:
            out.print(histogram(row))
    if temperature > 0:
        out.print(
            Text(
                "temperature > 0: outputs are samples, losslessness is not compared "
                "token by token.",
                style="yellow",
            )
        )


def environment(out: Console, env: dict):
    table = Table(
        title="environment", title_justify="left", title_style="bold", show_header=False
    )
    table.add_column(style="dim")
    table.add_column()
    for key, value in env.items():
        if value is None:
            continue
        style = "bold red" if key == "blas" and "slow" in str(value) else ""
        table.add_row(key, Text(str(value), style=style))
    out.print(table)


def lossless_failure(out: Console, failures: list[dict]):
    lines = Text()
    lines.append(
        f"{len(failures)} generation(s) differ from plain mlx-lm decoding at "
        "temperature 0. DFlash must be lossless: this is a bug.\n",
        style="bold",
    )
    for f in failures[:20]:
        lines.append(_where(f) + _why(f) + "\n")
    if len(failures) > 20:
        lines.append(f"  … and {len(failures) - 20} more (see --json)\n")
    out.print(
        Panel(
            lines,
            title="LOSSLESSNESS FAILURE",
            border_style="bold red",
            title_align="left",
        )
    )


def _where(f: dict) -> str:
    return (
        f"  {f['dataset']} sample {f['sample']} turn {f['turn'] + 1}: engine "
        f"{f['engine']} B={f['block_size']} first differs at token "
        f"{f['first_mismatch']}"
    )


def _why(f: dict) -> str:
    """The classified difference: the tokens and their logit gap."""
    diffs = (f.get("exactness") or {}).get("differences") or []
    gaps = [d for d in diffs if d["gap"] is not None]
    return "".join(
        f"; token {d['index']}: {d['expected']} vs {d['got']}, gap {d['gap']:.3g} "
        f"(tolerance {d['tolerance']:.3g})"
        for d in gaps[-1:]
    )


def near_ties(out: Console, ties: list[dict]):
    """Outputs that left plain decoding only where its top-2 logits tie."""
    lines = Text(
        f"{len(ties)} generation(s) differ from plain decoding only at near-ties: the "
        "target's top two logits were within the tolerance there, and the rest "
        "equals plain decoding from that token (kernels that round by block size "
        "break such ties either way; docs/design-and-losslessness.md).\n",
        style="yellow",
    )
    for f in ties[:10]:
        lines.append(_where(f) + _why(f) + "\n", style="dim")
    out.print(lines)


def loading(out: Console, what: str):
    out.print(Text(f"loading {what} …", style="dim"))


def note(out: Console, message: str):
    out.print(Text(message, style="dim"))


def error(out: Console, message: str):
    out.print(Text(f"error: {message}", style="bold red"))
