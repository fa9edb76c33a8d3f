"""Reading the chat's messages: a line editor on a terminal (editor.py: prompt_toolkit
with ←/→, Home/End, ↑/↓ and Ctrl-R through the history, bracketed paste), else
`input()` as before.

A line ending in \\ continues on the next; a \"\"\" line opens a block that the next
\"\"\" line closes; a pasted (or recalled) block of several lines is one message as it
stands. `read()` raises KeyboardInterrupt at Ctrl-C (the line is dropped), EOFError at
Ctrl-D on an empty line (leave), and a UnicodeError for bytes that are not UTF-8.
"""

import os
import sys
from collections.abc import Callable

BLOCK = '"""'
FIRST, MORE = "first", "more"  # the message's first line, a continuation line
DUMB_TERMINALS = ("", "dumb", "unknown")
FIX = "plain input (set TERM=xterm-256color for arrow keys, history and paste)"


def assemble(ask: Callable[[str], str]) -> str:
    """One message from `ask(FIRST or MORE)`, each call one entry: a typed line, or a
    pasted block."""
    first = ask(FIRST)
    if "\n" in first:
        return first
    if first.strip() == BLOCK:
        lines: list[str] = []
        while (more := ask(MORE)).strip() != BLOCK:
            lines.append(more)
        return "\n".join(lines)
    lines = []
    line = first
    while line.endswith("\\"):
        lines.append(line[:-1])
        line = ask(MORE)
    return "\n".join(lines + [line])


def check_utf8(text: str) -> str:
    """`text`, or UnicodeEncodeError if it holds bytes that were not UTF-8 (which a
    terminal reader keeps as lone surrogates)."""
    text.encode("utf-8")
    return text


class Reader:
    """The chat's reader: the line editor while it works, else `input()` (through
    Rich on a terminal). `note` says why line editing is off, when it is."""

    def __init__(self, out, editor=None, note=None, warn=None, read_line=input):
        self.out, self.editor, self.note = out, editor, note
        self.warn = warn  # shows a note when the editor fails mid-session
        self.read_line = read_line  # input() when stdout is not a terminal

    def read(self) -> str:
        if self.editor is not None:
            try:
                text = assemble(self._edit)
                self.editor.keep(text)
                return text
            except (KeyboardInterrupt, EOFError, UnicodeError):
                raise
            except Exception as e:  # a terminal the editor cannot drive after all
                self.editor = None
                self.note = f"line editing off ({type(e).__name__}: {e}); {FIX}"
                if self.warn:
                    self.warn(self.note)
        return assemble(self._ask)

    def _edit(self, kind: str) -> str:
        return check_utf8(self.editor.ask(first=kind == FIRST))

    def _ask(self, kind: str) -> str:
        if not self.out.is_terminal:
            return self.read_line()
        return self.out.input("[bold blue]>>> [/]" if kind == FIRST else "[dim]... [/]")


def open_reader(out, history_path=None, warn=None, stdin=None) -> Reader:
    """The line editor when stdin and stdout are a terminal that can run it (the
    history in `history_path`, None for none); else plain input, with a note saying
    why when it is a terminal."""
    if not (out.is_terminal and (stdin or sys.stdin).isatty()):
        return Reader(out)
    term = os.environ.get("TERM", "")
    if term in DUMB_TERMINALS:
        return Reader(out, note=f"line editing off (TERM={term or 'unset'}): {FIX}")
    try:
        from .editor import Editor

        return Reader(out, Editor(history_path), warn=warn)
    except ImportError:
        note = (
            "line editing off: prompt_toolkit is missing (pip install prompt-toolkit)"
        )
    except Exception as e:  # e.g. a console prompt_toolkit cannot drive
        note = f"line editing off ({type(e).__name__}: {e}); {FIX}"
    return Reader(out, note=note)
