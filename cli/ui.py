"""Rich terminal code shared by the commands: the engine line (live and per turn),
banners, tables, messages. The chat's streaming answer is in answer_ui.py."""

from rich.console import Console
from rich.table import Table
from rich.text import Text


def console(stderr: bool = False) -> Console:
    return Console(stderr=stderr, highlight=False, soft_wrap=stderr)


def _fmt(value, spec: str, none: str = "–") -> str:
    return none if value is None else format(value, spec)


SPECULATING = ("dflash", "lookup")  # modes whose blocks may verify proposals


def mode_label(mode: str, block_size) -> str:
    if mode == "lookup":
        return "plain + lookup"  # no drafter: a plain step or a copy, per block
    if mode != "dflash":
        return "plain"
    return "DFlash auto" if block_size == "auto" else f"DFlash b{block_size}"


def _now(stats) -> str:
    """What the last block did: "now b4 draft" (its verify size, who proposed) or
    "now plain"."""
    if stats.last_block_size is None:
        return ""
    if stats.last_source is None:
        return " · now plain"
    return f" · now b{stats.last_block_size} {stats.last_source}"


def _drafted(stats) -> str:
    done = "copied" if stats.mode == "lookup" else "drafted"
    return f"{stats.drafted_blocks}/{stats.blocks} blocks {done}"


def _drafted_detail(stats) -> str:
    """The verify sizes of the drafted blocks and, past the drafter alone, who
    proposed: "(b2–b8; draft 9, lookup 3)"."""
    sizes = sorted(s for s in stats.sizes if s > 1)
    parts = []
    if sizes:
        low, high = sizes[0], sizes[-1]
        parts.append(f"b{low}" if low == high else f"b{low}–b{high}")
    if set(stats.sources) - {"draft"}:
        parts.append(", ".join(f"{k} {v}" for k, v in sorted(stats.sources.items())))
    return f" ({'; '.join(parts)})" if parts else ""


def engine_summary(stats) -> str:
    """The turn's engine in words: "DFlash auto: 12/20 blocks drafted (b2–b8),
    8 plain"; "plain" without speculation."""
    label = mode_label(stats.mode, stats.block_size)
    if stats.mode not in SPECULATING or not stats.blocks:
        return label
    text = f"{label}: {_drafted(stats)}{_drafted_detail(stats)}"
    if not stats.drafted_blocks:
        return text + ", all plain"
    return text + (f", {stats.plain_blocks} plain" if stats.plain_blocks else "")


def status_line(stats, note: str | None = None) -> Text:
    """Live numbers for the answer in progress: what the engine does (the last
    block's size and proposer, or plain; the share of blocks drafted), tok/s, τ."""
    t = Text()
    speculating = stats.mode in SPECULATING
    drafting = speculating and stats.last_source is not None
    fresh = speculating and stats.last_block_size is None
    t.append("● ", style="bold green" if drafting or fresh else "bold yellow")
    t.append(mode_label(stats.mode, stats.block_size), style="bold")
    if speculating and stats.blocks:
        t.append(_now(stats), style="bold" if drafting else "bold yellow")
        t.append(f" · {_drafted(stats)}")
    t.append(f"  {stats.generation_tps:7.1f} tok/s", style="cyan")
    if speculating:
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
    t.append(f" · {engine_summary(stats)}")
    if stats.mode in SPECULATING:
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
    if info.get("editing"):
        out.print(Text(info["editing"], style="yellow"))
    out.print(
        Text(
            "Type /help for commands. Ctrl-C stops an answer; Ctrl-D or /exit leaves.",
            style="dim",
        )
    )


INPUT_HELP = {
    '"""': "start/end a multi-line message (or end lines with \\)",
    "paste": "a pasted block of lines is one message",
    "↑ ↓  Ctrl-R": "earlier messages, kept across sessions (--no-history: none)",
    "Ctrl-C": "stop the answer at the next block; at the prompt, drop the line",
}


def help_table(out: Console, commands: dict):
    table = Table(show_header=False, box=None, padding=(0, 2))
    for cmd, what in {**commands, **INPUT_HELP}.items():
        table.add_row(Text(cmd, style="bold"), what)
    out.print(table)


def _share(stats: dict) -> str:
    if not stats["blocks"]:
        return "–"
    share = 100 * stats["drafted_blocks"] / stats["blocks"]
    return (
        f"{stats['drafted_blocks']} / {stats['blocks']} ({share:.0f}%; the rest plain)"
    )


def stats_table(out: Console, stats: dict):
    table = Table(title="session", show_header=False, box=None, padding=(0, 2))
    rows = [
        ("turns", stats["turns"]),
        ("generated tokens", stats["generated_tokens"]),
        ("mode", mode_label(stats["mode"], stats["block_size"])),
        ("temperature", f"{stats['temperature']:g}"),
        ("mean τ (DFlash turns)", _fmt(stats["mean_acceptance"], ".2f")),
        ("drafted blocks (DFlash turns)", _share(stats)),
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
    if getattr(config, "kv_bits", None):
        kv = f"KV cache {config.kv_bits}-bit (groups of {config.kv_group_size})"
        out.print(Text(f"{kv}: requests decode one at a time", style="dim"))
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
    if getattr(config, "ui", False):
        page = url.removesuffix("/v1")
        out.print(
            Text.assemble(
                "Dashboard ", (f"{page}/", "cyan"), "  chat ", (f"{page}/chat", "cyan")
            ),
            soft_wrap=True,
        )
