"""Streamed Markdown cut into blocks: what the chat can render once, and the unfinished
tail it keeps redrawing.

Text arrives a few tokens at a time. A block is finished when a blank line is followed
by an unindented line (an indented one may continue a list item), when a heading line
ends, or when a code fence closes. A fenced code block is also handed out in chunks of
`chunk_lines` lines, and so is a long run of lines without a blank, so the live tail
stays a few lines tall and cheap to redraw however long the answer is.
"""

import re
from typing import NamedTuple

_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})\s*([^`\s]*)")
_HEADING = re.compile(r"^ {0,3}#{1,6}(\s|$)")
CHUNK_LINES = 24


class Block(NamedTuple):
    """Markdown text, or code lines of a fenced block (`lang` from its info string).

    `opens`: the first part of a block (the UI separates it from what came before);
    False for a later chunk of the same code block or run of lines."""

    text: str
    code: bool = False
    lang: str = ""
    opens: bool = True


class MarkdownBlocks:
    """Feed text as it streams; get the blocks that are finished, and the tail."""

    def __init__(self, chunk_lines: int = CHUNK_LINES):
        self.chunk_lines = chunk_lines
        self._lines: list[str] = []  # complete lines of the block in progress
        self._partial = ""  # the line being written
        self._fence: str | None = None  # the open fence's marker, in a code block
        self._lang = ""
        self._opens = True  # the block in progress starts a new block

    def feed(self, text: str) -> list[Block]:
        """Add streamed text; the blocks it finished, in order."""
        done: list[Block] = []
        *complete, self._partial = (self._partial + text).split("\n")
        for line in complete:
            self._line(line, done)
        if self._partial and self._after_blank(self._partial):
            self._emit(done)  # its first character says the block before is done
        return done

    def close(self) -> list[Block]:
        """The answer ended: everything left, as finished blocks."""
        done: list[Block] = []
        if self._partial:
            self._line(self._partial, done)
            self._partial = ""
        self._emit(done)
        self._fence = None
        return done

    def tail(self) -> Block | None:
        """The unfinished block as it stands (None when there is nothing to show)."""
        lines = self._lines + ([self._partial] if self._partial else [])
        if self._fence is None:
            while lines and not lines[-1].strip():
                lines = lines[:-1]
        if not lines or (self._fence is None and not "".join(lines).strip()):
            return None
        return Block("\n".join(lines), self._fence is not None, self._lang, self._opens)

    def _line(self, line: str, done: list[Block]):
        if self._fence is not None:
            self._code_line(line, done)
            return
        blank = not line.strip()
        if blank:
            if self._lines:
                self._lines.append(line)
            else:
                self._opens = True  # a run handed out in chunks ended
            return
        if self._after_blank(line):
            self._emit(done)
        fence = _FENCE.match(line)
        if fence:
            self._emit(done)
            self._fence, self._lang = fence.group(1), fence.group(2)
            return
        if _HEADING.match(line):
            self._emit(done)
            self._lines = [line]
            self._emit(done)
            return
        self._lines.append(line)
        if len(self._lines) >= self.chunk_lines:
            self._emit(done)
            self._opens = False

    def _after_blank(self, line: str) -> bool:
        """`line` starts something new after a blank line (indented, it may continue a
        list item)."""
        return (
            self._fence is None
            and bool(self._lines)
            and not self._lines[-1].strip()
            and not line[0].isspace()
        )

    def _code_line(self, line: str, done: list[Block]):
        assert self._fence is not None
        stripped = line.strip()
        marker = self._fence[0]
        closes = (
            len(line) - len(line.lstrip(" ")) <= 3
            and stripped.startswith(self._fence)
            and set(stripped) == {marker}
        )
        if closes:
            self._emit(done, keep_empty=self._opens)
            self._fence, self._lang = None, ""
            return
        self._lines.append(line)
        if len(self._lines) >= self.chunk_lines:
            self._emit(done)
            self._opens = False

    def _emit(self, done: list[Block], keep_empty: bool = False):
        """Hand out the block in progress (if any) and start a new one."""
        lines = self._lines
        if self._fence is None:
            while lines and not lines[-1].strip():
                lines = lines[:-1]
        if lines or keep_empty:
            done.append(
                Block(
                    "\n".join(lines), self._fence is not None, self._lang, self._opens
                )
            )
        self._lines = []
        self._opens = True
