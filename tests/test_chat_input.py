"""The chat's input: assembling a message, the history file, picking a reader."""

import io
import json
import os
import stat

import pytest
from rich.console import Console

from dflash_mlx.chat.history import MAX_CHARS, InputHistory, history_file
from dflash_mlx.cli import lineedit
from dflash_mlx.cli.editor import MessageHistory


def asker(*entries):
    """An `ask` returning `entries` in turn, and the prompt kinds it was asked with."""
    kinds, it = [], iter(entries)

    def ask(kind):
        kinds.append(kind)
        return next(it)

    return ask, kinds


def test_assemble_keeps_the_multi_line_forms():
    ask, kinds = asker('"""', "line one", "  line two", '"""')
    assert lineedit.assemble(ask) == "line one\n  line two"
    assert kinds == [lineedit.FIRST] + [lineedit.MORE] * 3
    ask, _ = asker("first \\", "second\\", "third")
    assert lineedit.assemble(ask) == "first \nsecond\nthird"
    # a pasted block is one message as it stands, whatever its lines end with
    ask, kinds = asker('"""\ndef f():\\\n    pass')
    assert lineedit.assemble(ask) == '"""\ndef f():\\\n    pass' and len(kinds) == 1


def test_bytes_that_are_not_utf8_are_refused():
    assert lineedit.check_utf8("café") == "café"
    with pytest.raises(UnicodeError):
        lineedit.check_utf8(b"caf\xe9".decode("utf-8", "surrogateescape"))


def test_history_persists_bounded_and_private(tmp_path):
    path = tmp_path / "cache" / "history.jsonl"
    h = InputHistory(path, limit=3)
    assert h.entries == [] and not path.exists()
    for text in ["one", "two\nlines", "two\nlines", "  ", "x" * (MAX_CHARS + 1)]:
        h.add(text)
    assert h.entries == ["one", "two\nlines"]  # no repeat, blank or huge entry
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert InputHistory(path, limit=3).entries == ["one", "two\nlines"]
    for i in range(10):
        h.add(f"m{i}")
    assert h.entries == ["m7", "m8", "m9"]
    assert len(path.read_text().splitlines()) <= 6  # trimmed at twice the limit
    assert InputHistory(path, limit=3).entries == ["m7", "m8", "m9"]
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_a_broken_or_unwritable_history_never_stops_the_chat(tmp_path):
    path = tmp_path / "history.jsonl"
    path.write_bytes(b'"ok"\nnot json\n\xff\xfe\n{"a": 1}\n"fine"\n')
    assert InputHistory(path).entries == ["ok", "fine"]  # the rest is skipped
    blocked = tmp_path / "file"
    blocked.write_text("")
    h = InputHistory(blocked / "history.jsonl")  # its folder is a file
    assert h.add("kept in memory") and h.entries == ["kept in memory"]


def test_the_history_lives_in_the_user_cache(user_cache):
    assert history_file().parent == user_cache / "dflash-mlx"


def test_the_editor_history_keeps_whole_messages(tmp_path):
    stored = InputHistory(tmp_path / "h.jsonl")
    stored.add("from last time")
    history = MessageHistory(stored)
    assert list(history.load_history_strings()) == ["from last time"]
    history.append_string('"""')  # a line the editor accepted: not a message
    history.keep("line one\nline two")
    history.keep("line one\nline two")
    history.keep("   ")
    assert history.get_strings() == ["line one\nline two"]
    lines = (tmp_path / "h.jsonl").read_text().splitlines()
    assert [json.loads(line) for line in lines] == [
        "from last time",
        "line one\nline two",
    ]
    assert MessageHistory(None).get_strings() == []


def test_the_reader_falls_back_with_a_note(monkeypatch):
    piped = Console(file=io.StringIO(), force_terminal=False)
    reader = lineedit.open_reader(piped, stdin=_Tty())
    assert reader.editor is None and reader.note is None  # piped: input() as before
    tty = Console(file=io.StringIO(), force_terminal=True)
    monkeypatch.setenv("TERM", "dumb")
    reader = lineedit.open_reader(tty, stdin=_Tty())
    assert reader.editor is None and "TERM=dumb" in reader.note
    assert "TERM=xterm-256color" in reader.note


def test_an_editor_that_fails_hands_over_to_plain_input():
    out = Console(file=io.StringIO(), force_terminal=False)
    notes: list[str] = []

    class Broken:
        def ask(self, first):
            raise OSError(5, "Input/output error")

    reader = lineedit.Reader(
        out, Broken(), warn=notes.append, read_line=lambda: "typed anyway"
    )
    assert reader.read() == "typed anyway"
    assert reader.editor is None and notes == [reader.note] and "OSError" in notes[0]


class _Tty(io.StringIO):
    def isatty(self):
        return True


def test_history_file_is_not_written_for_piped_input(tmp_path):
    reader = lineedit.open_reader(
        Console(file=io.StringIO()), tmp_path / "h.jsonl", stdin=io.StringIO()
    )
    reader.read_line = lambda: "piped text"
    assert reader.read() == "piped text"
    assert not os.path.exists(tmp_path / "h.jsonl")
