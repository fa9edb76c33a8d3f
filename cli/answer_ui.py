"""The chat's answer as it streams: Markdown rendered block by block (or raw text), a
live tail and the engine line under it.

A finished block (dflash_mlx/chat/markdown.py says when one is) is rendered and printed
once; only the unfinished tail is redrawn, a few lines at most, and never more often
than its cost allows (REFRESH_SECONDS, COST_RATIO), so drawing takes a small, bounded
share of the answer's time whatever the speed of decoding.
"""

import io
import sys
import time

from rich.console import Console, ConsoleOptions, Group, RenderableType
from rich.live import Live
from rich.markdown import Markdown
from rich.segment import Segment
from rich.syntax import Syntax
from rich.text import Text

from dflash_mlx.chat.markdown import MarkdownBlocks

STYLE_DRAFT = "green"
STYLE_TARGET = "bright_white"
STYLE_THINK = "dim italic"
CODE_THEME = "monokai"
# the live tail is redrawn at most this often, and a redraw that took t seconds waits
# COST_RATIO * t for the next: a costly tail is redrawn less often, decoding never
# waits on it for more than ~1% of the time
REFRESH_SECONDS = 1 / 12
COST_RATIO = 100
# new prompt tokens from which the view shows the prefill's progress
LONG_PROMPT = 1024
# control characters a model may emit are shown as their symbols (␛, ␍, ...), never
# sent to the terminal as codes; newlines and tabs stay
VISIBLE = {c: 0x2400 + c for c in range(32) if chr(c) not in "\n\t"} | {127: 0x2421}
WARM_UP = "# a\n\n- **b** `c`\n\n```python\nd = [1]\n```\n"


def piece_style(piece, color: bool) -> str:
    if piece.thinking:
        return STYLE_THINK + (" green" if color and piece.drafted else "")
    if color:
        return STYLE_DRAFT if piece.drafted else STYLE_TARGET
    return ""


class Lines:
    """Lines already rendered to segments, as a renderable (the last `keep` only)."""

    def __init__(self, lines: list[list[Segment]], keep: int | None = None):
        self.lines = lines if keep is None else lines[-keep:]

    def __rich_console__(self, console: Console, options: ConsoleOptions):
        for line in self.lines:
            yield from line
            yield Segment.line()


def render_block(console: Console, block) -> list[list[Segment]]:
    """A Markdown block (or code lines) rendered to lines at the console's width."""
    renderable: RenderableType
    if block.code:
        renderable = Syntax(
            block.text,
            block.lang or "text",
            theme=CODE_THEME,
            word_wrap=True,
            padding=(0, 1),
        )
    else:
        renderable = Markdown(block.text, code_theme=CODE_THEME)
    lines = console.render_lines(renderable, console.options, pad=False)
    if not block.code:  # the blank lines around blocks are the view's to place
        while lines and not "".join(s.text for s in lines[0]).strip():
            lines.pop(0)
        while lines and not "".join(s.text for s in lines[-1]).strip():
            lines.pop()
    return lines


def warm_up(out: Console):
    """Import and run the Markdown and syntax renderers once (~0.2 s the first time),
    so the first answer does not pay for it."""
    scratch = Console(file=io.StringIO(), force_terminal=True, width=out.size.width)
    blocks = MarkdownBlocks()
    for block in blocks.feed(WARM_UP) + blocks.close():
        render_block(scratch, block)


class AnswerView:
    """Streams an answer: on a terminal, finished text printed once and a live tail
    plus the engine line; elsewhere, raw text (and the summary on stderr).

    `markdown`: render the answer's Markdown (thinking text stays raw and dimmed);
    else raw text, coloured by source with `color`. `line(stats, final)` draws the
    engine line. Drawing waits for the next redraw (at most every REFRESH_SECONDS,
    less often when the tail is costly), so a block costs only appending text."""

    def __init__(
        self,
        out: Console,
        line,
        *,
        markdown: bool = True,
        color: bool = False,
        err: Console | None = None,
        refresh_seconds: float = REFRESH_SECONDS,
        cost_ratio: float = COST_RATIO,
    ):
        self.refresh_seconds, self.cost_ratio = refresh_seconds, cost_ratio
        self.out, self.line = out, line
        self.markdown, self.color = markdown and not color, color
        self.err = err
        self.live: Live | None = None
        self.raw = Text()  # raw text not printed yet
        self.blocks = MarkdownBlocks()
        self.done: list = []  # finished Markdown blocks and raw lines, not printed yet
        self.printed = False  # something of this answer is on the screen already
        self.stats = None
        self.render_seconds = 0.0  # time spent drawing (the cost of the view)
        self._next = 0.0
        self._read_from: int | None = None  # tokens cached before this prompt
        self._reading: Text | None = None

    def __enter__(self):
        if self.out.is_terminal:
            self.live = Live(
                console=self.out,
                auto_refresh=False,
                vertical_overflow="crop",
                transient=False,
            )
            self.live.start()
            self.live.update(self._line(False), refresh=True)
        return self

    def update(self, chunk):
        tic = time.perf_counter()
        self.stats = chunk.stats
        if self.live is None:
            sys.stdout.write(chunk.text)
            sys.stdout.flush()
        else:
            for piece in chunk.pieces:
                text = piece.text.translate(VISIBLE)
                if self.markdown and not piece.thinking:
                    self._cut_raw(whole=True)
                    self.done += self.blocks.feed(text)
                else:
                    self.done += self.blocks.close()
                    self.raw.append(text, style=piece_style(piece, self.color))
            self._cut_raw()
            if tic >= self._next:
                self._refresh()
        self.render_seconds += time.perf_counter() - tic

    def _cut_raw(self, whole: bool = False):
        """Move the raw text's finished lines (all of it with `whole`) to `done`."""
        plain = self.raw.plain
        cut = len(plain) if whole else plain.rfind("\n") + 1
        if cut > 0:
            done, self.raw = self.raw[:cut], self.raw[cut:]
            if done.plain.endswith("\n"):
                done.right_crop(1)  # each printed line ends with one
            self.done.append(done)

    def _flush(self):
        """Print what is finished, once."""
        lines: list[list[Segment]] = []
        for item in self.done:
            if isinstance(item, Text):
                lines += self.out.render_lines(item, self.out.options, pad=False)
                self.printed = True
                continue
            rendered = render_block(self.out, item)
            if rendered and item.opens and (self.printed or lines):
                lines.append([])
            lines += rendered
            self.printed = self.printed or bool(rendered)
        self.done = []
        if lines:
            self._print(lines)

    def _print(self, lines: list[list[Segment]]):
        """Print finished lines above the live tail, for good."""
        assert self.live is not None
        self.live.console.print(Lines(lines))

    def _tail(self) -> RenderableType:
        """The unfinished part, cut to what fits above the engine line."""
        room = max(self.out.size.height - 4, 4)
        tail = self.blocks.tail()
        if tail is not None:
            lines = render_block(self.out, tail)
            if tail.opens and self.printed:
                lines.insert(0, [])
        elif self.raw.plain:
            lines = self.out.render_lines(self.raw, self.out.options, pad=False)
        else:
            lines = []
        return Lines(lines, keep=room)

    def prefilling(self, done: int, total: int):
        """The prompt's progress through the target (a long paste takes a while)."""
        if self.live is None or self.stats is not None:
            return
        if self._read_from is None:
            self._read_from = done
        if total - self._read_from < LONG_PROMPT:
            return  # a short prompt: the first block comes at once
        self._reading = Text(
            f"… reading the prompt: {done:,} / {total:,} tokens", style="dim"
        )
        self.live.update(self._reading, refresh=True)

    def _line(self, final: bool) -> RenderableType:
        if self.stats is None:
            return Text() if final else (self._reading or Text("…", style="dim"))
        return self.line(self.stats, final)

    def _refresh(self):
        assert self.live is not None
        self._flush()
        tic = time.perf_counter()
        self.live.update(Group(self._tail(), self._line(False)), refresh=True)
        cost = time.perf_counter() - tic
        self._next = tic + max(self.refresh_seconds, cost * self.cost_ratio)

    def __exit__(self, *exc):
        tic = time.perf_counter()
        if self.live is not None:
            self.done += self.blocks.close()
            self._cut_raw(whole=True)
            self._flush()
            self.live.update(self._line(True), refresh=True)
            self.live.stop()
        else:
            sys.stdout.write("\n")
            sys.stdout.flush()
            if self.stats is not None and self.err is not None:
                self.err.print(self.line(self.stats, True))
        self.render_seconds += time.perf_counter() - tic
        return False
