"""All Rich terminal code: the chat's live answer view, status lines, tables."""

import sys

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

STYLE_DRAFT = "green"
STYLE_TARGET = "bright_white"
STYLE_THINK = "dim italic"


def console(stderr: bool = False) -> Console:
    return Console(stderr=stderr, highlight=False, soft_wrap=stderr)


def _fmt(value, spec: str, none: str = "–") -> str:
    return none if value is None else format(value, spec)


def mode_label(mode: str, block_size) -> str:
    if mode != "dflash":
        return "plain"
    return "DFlash auto" if block_size == "auto" else f"DFlash b{block_size}"


def status_line(stats, note: str | None = None) -> Text:
    """Live numbers for the answer in progress (updated every verified block)."""
    t = Text()
    t.append("● ", style="bold green" if stats.mode == "dflash" else "bold yellow")
    t.append(mode_label(stats.mode, stats.block_size), style="bold")
    t.append(f"  {stats.generation_tps:7.1f} tok/s", style="cyan")
    if stats.mode == "dflash":
        t.append(
            f"  τ {_fmt(stats.mean_accepted, '.2f')} "
            f"(last {_fmt(stats.last_accepted, 'd')})",
            style="magenta",
        )
    t.append(
        f"  {stats.generation_tokens} tok  {stats.elapsed:.1f} s  "
        f"{stats.peak_memory:.2f} GB",
        style="dim",
    )
    if note:
        t.append(f"  [{note}]", style="yellow")
    return t


def summary_line(stats, note: str | None = None) -> Text:
    """The per-turn line printed when an answer ends."""
    t = Text(style="dim")
    cached = f", {stats.reused_tokens} cached" if stats.reused_tokens else ""
    t.append(
        f"prompt {stats.prompt_tokens} tok{cached} @ {stats.prompt_tps:.0f} tok/s"
        f" · TTFT {stats.ttft * 1000:.0f} ms · "
    )
    t.append(
        f"gen {stats.generation_tokens} tok @ {stats.generation_tps:.1f} tok/s",
        style="cyan",
    )
    t.append(f" · {mode_label(stats.mode, stats.block_size)}")
    if stats.mode == "dflash":
        t.append(f" · τ {_fmt(stats.mean_accepted, '.2f')}", style="magenta")
    if stats.speedup:
        t.append(f" · {stats.speedup:.2f}× vs plain", style="bold green")
    t.append(f" · {stats.peak_memory:.2f} GB")
    if stats.finish_reason == "interrupted":
        t.append(" · interrupted", style="bold red")
    elif stats.finish_reason == "length":
        t.append(" · hit max tokens", style="yellow")
    if note:
        t.append(f" · {note}", style="yellow")
    return t


def piece_style(piece, color: bool) -> str:
    if piece.thinking:
        return STYLE_THINK + (" green" if color and piece.drafted else "")
    if color:
        return STYLE_DRAFT if piece.drafted else STYLE_TARGET
    return ""


class AnswerView:
    """Streams an answer: a live tail + status line on a terminal, else plain text."""

    def __init__(self, out: Console, color: bool = False, note: str | None = None):
        self.out, self.color, self.note = out, color, note
        self.live: Live | None = None
        self.tail = Text()
        self.stats = None
        self.err = console(stderr=True)

    def __enter__(self):
        if self.out.is_terminal:
            self.live = Live(
                console=self.out,
                auto_refresh=True,
                refresh_per_second=12,
                vertical_overflow="crop",
                transient=False,
            )
            self.live.start()
        return self

    def _render(self, final: bool = False):
        if final:
            line = summary_line(self.stats, self.note) if self.stats else Text()
        else:
            line = (
                status_line(self.stats, self.note)
                if self.stats
                else Text("…", style="dim")
            )
        return Group(self.tail, line)

    def update(self, chunk):
        self.stats = chunk.stats
        if self.live is None:
            sys.stdout.write(chunk.text)
            sys.stdout.flush()
            return
        for piece in chunk.pieces:
            self.tail.append(piece.text, style=piece_style(piece, self.color))
        if (
            "\n" in self.tail.plain
        ):  # finished lines scroll up for good; the live part stays small
            cut = self.tail.plain.rindex("\n") + 1
            done, self.tail = self.tail[:cut], self.tail[cut:]
            self.live.console.print(done, end="")
        self.live.update(self._render())

    def __exit__(self, *exc):
        if self.live is not None:
            self.live.update(self._render(final=True), refresh=True)
            self.live.stop()
        else:
            sys.stdout.write("\n")
            sys.stdout.flush()
            if self.stats is not None:
                self.err.print(summary_line(self.stats, self.note))
        return False


def banner(out: Console, info: dict):
    out.print(Text.assemble(("dflash-mlx chat", "bold"), "  ", (info["model"], "cyan")))
    if info.get("draft"):
        out.print(
            Text.assemble(
                "drafter ", (info["draft"], "green"), f"  block {info['block_size']}"
            )
        )
    if info.get("note"):
        out.print(Text(info["note"], style="yellow"))
    if info.get("thinking") is not None:
        out.print(Text(info["thinking"], style="dim"))
    out.print(
        Text(
            "Type /help for commands. Ctrl-C stops an answer; Ctrl-D or /exit leaves.",
            style="dim",
        )
    )


def read_message(out: Console) -> str:
    """One user message. A line ending in \\ continues; \"\"\" opens/closes a block."""
    line = out.input("[bold blue]>>> [/]") if out.is_terminal else input()
    if line.strip() == '"""':
        lines: list[str] = []
        while True:
            more = out.input("[dim]... [/]") if out.is_terminal else input()
            if more.strip() == '"""':
                return "\n".join(lines)
            lines.append(more)
    lines = []
    while line.endswith("\\"):
        lines.append(line[:-1])
        line = out.input("[dim]... [/]") if out.is_terminal else input()
    return "\n".join(lines + [line])


def help_table(out: Console, commands: dict):
    table = Table(show_header=False, box=None, padding=(0, 2))
    for cmd, what in commands.items():
        table.add_row(Text(cmd, style="bold"), what)
    table.add_row(
        Text('"""', style="bold"),
        "start/end a multi-line message (or end lines with \\)",
    )
    out.print(table)


def stats_table(out: Console, stats: dict):
    table = Table(title="session", show_header=False, box=None, padding=(0, 2))
    rows = [
        ("turns", stats["turns"]),
        ("generated tokens", stats["generated_tokens"]),
        ("mode", mode_label(stats["mode"], stats["block_size"])),
        ("temperature", f"{stats['temperature']:g}"),
        ("mean τ (DFlash turns)", _fmt(stats["mean_acceptance"], ".2f")),
        ("DFlash tok/s", _fmt(stats["dflash_tps"], ".1f")),
        ("plain tok/s", _fmt(stats["plain_tps"], ".1f")),
        (
            "cached tokens",
            f"{stats['cached_tokens']} / {_fmt(stats['context'], 'd', '?')}",
        ),
        (
            "last TTFT",
            _fmt(stats["last_ttft"] and stats["last_ttft"] * 1000, ".0f") + " ms",
        ),
        ("peak memory", f"{stats['peak_memory']:.2f} GB"),
    ]
    if stats["dflash_tps"] and stats["plain_tps"]:
        rows.append(("speedup", f"{stats['dflash_tps'] / stats['plain_tps']:.2f}×"))
    for k, v in rows:
        table.add_row(Text(k, style="dim"), str(v))
    out.print(table)


def info(out: Console, message: str):
    out.print(Text(message, style="cyan"))


def error(out: Console, message: str):
    out.print(Text(f"error: {message}", style="bold red"))


def cancelled(out: Console):
    out.print()
    out.print(Text("(line cancelled: Ctrl-D or /exit leaves)", style="dim"))


def interrupted(out: Console):
    out.print(
        Text("[interrupted: the partial answer stays in the conversation]", style="red")
    )


def loading(out: Console, what: str):
    """A spinner while models load (a context manager)."""
    return out.status(Text(f"loading {what}…", style="dim"), spinner="dots")


def generate_stats(err: Console, stats, note: str | None = None):
    err.print(summary_line(stats, note))


def warning(out: Console, message: str):
    out.print(Text(f"warning: {message}", style="bold yellow"))


def serve_banner(out: Console, config, note: str | None, device: str):
    """What `dflash-mlx serve` runs: the pair, the engine settings and the device."""
    out.print(
        Text.assemble(("dflash-mlx serve", "bold"), "  ", (config.model_id, "cyan")),
        soft_wrap=True,
    )
    if config.draft_id:
        out.print(
            Text.assemble(
                "drafter ", (config.draft_id, "green"), f"  block {config.block_size}"
            ),
            soft_wrap=True,
        )
    if note:
        out.print(Text(note, style="yellow"))
    out.print(Text(device, style="dim"), soft_wrap=True)


def serve_ready(out: Console, url: str, config):
    out.print(
        Text.assemble(
            ("Ready", "bold green"),
            f" at {url}  ({config.max_concurrency} concurrent, queue "
            f"{config.max_queue}, max {config.max_tokens} tokens). Ctrl-C stops.",
        ),
        soft_wrap=True,
    )
