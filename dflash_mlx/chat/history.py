"""The chat's input history: the messages and commands typed at the prompt, kept in a
bounded file in the user cache (one JSON string a line, newest last) for the next
session's ↑ and Ctrl-R. Nothing else goes in: no answers, no piped input."""

import json
import os
from pathlib import Path

from ..files import user_cache, write_text

LIMIT = 1000  # entries kept
MAX_CHARS = 20_000  # a longer message (a pasted file) is not kept


def history_file() -> Path:
    """Where the chat keeps what was typed: <user cache>/chat-history.jsonl."""
    return user_cache() / "chat-history.jsonl"


class InputHistory:
    """Entries of `path`, oldest first; `add` appends one and keeps the last `limit`.

    A file that cannot be read starts an empty history; one that cannot be written
    leaves the history in memory only (it only saves typing)."""

    def __init__(self, path: str | os.PathLike, limit: int = LIMIT):
        self.path, self.limit = Path(path), limit
        self._lines = 0  # lines in the file: it is trimmed when twice `limit`
        self.entries = self._read()

    def _read(self) -> list[str]:
        try:
            data = self.path.read_bytes()
        except OSError:
            return []
        lines = data.decode("utf-8", "replace").splitlines()
        self._lines = len(lines)
        entries = []
        for line in lines[-self.limit :]:
            try:
                entry = json.loads(line)
            except ValueError:
                continue
            if isinstance(entry, str) and entry:
                entries.append(entry)
        return entries

    def add(self, text: str) -> bool:
        """Keep `text` (not when blank, too long, or the same as the last entry);
        whether it was kept."""
        if not text.strip() or len(text) > MAX_CHARS:
            return False
        if self.entries and self.entries[-1] == text:
            return False
        self.entries.append(text)
        del self.entries[: -self.limit]
        try:
            if self._lines + 1 > 2 * self.limit:
                self._rewrite()
            else:
                self._append(json.dumps(text, ensure_ascii=False) + "\n")
        except OSError:
            pass
        return True

    def _append(self, line: str):
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        with os.fdopen(fd, "a", encoding="utf-8") as f:
            f.write(line)
        self._lines += 1

    def _rewrite(self):
        """The last `limit` entries only (the file grows to twice that between)."""
        text = "".join(json.dumps(e, ensure_ascii=False) + "\n" for e in self.entries)
        write_text(self.path, text)  # keeps the file's mode (0o600)
        self._lines = len(self.entries)
