"""The chat's line editor: prompt_toolkit's prompt (emacs keys: ←/→, Home/End, ↑/↓
through the history, Ctrl-R to search it; bracketed paste, so a pasted block of lines
arrives as one entry), over the history file in the user cache."""

from prompt_toolkit import PromptSession
from prompt_toolkit.formatted_text import FormattedText
from prompt_toolkit.history import History

from dflash_mlx.chat.history import InputHistory

PROMPT = FormattedText([("bold ansiblue", ">>> ")])
MORE = FormattedText([("ansibrightblack", "... ")])  # a message's next line


class MessageHistory(History):
    """prompt_toolkit's view of the chat's history: whole messages, which the reader
    adds with `keep` (a \"\"\" or \\ line that the editor accepts is not one)."""

    def __init__(self, stored: InputHistory | None):
        super().__init__()
        self.stored = stored

    def load_history_strings(self):
        return reversed(self.stored.entries) if self.stored else iter(())

    def store_string(self, string: str) -> None:
        if self.stored is not None:
            self.stored.add(string)

    def append_string(self, string: str) -> None:
        pass  # each line the editor accepts: `keep` adds whole messages instead

    def keep(self, text: str):
        strings = self.get_strings()
        if text.strip() and (not strings or strings[-1] != text):
            super().append_string(text)


class Editor:
    """One line (or pasted block) at a time with prompt_toolkit; lineedit.Reader
    makes messages of them and hands each back to `keep`."""

    def __init__(self, history_path=None):
        stored = InputHistory(history_path) if history_path else None
        self.history = MessageHistory(stored)
        self.session: PromptSession = PromptSession(history=self.history)

    def ask(self, first: bool) -> str:
        return self.session.prompt(PROMPT if first else MORE)

    def keep(self, message: str):
        self.history.keep(message)
