"""Token-exact history: the ids a client's resent answers had when they were made.

A client resends the whole conversation every turn, the assistant's earlier answers as
text. Encoding that text again can split it differently from the ids that were
generated (and a byte-level model's answer may not even be valid UTF-8), and the prefix
cache would then miss from there on. The server keeps, for recent answers, the text
the chat template renders up to the answer's end and the ids the caches hold for it;
a prompt that starts with one such text reuses its ids and encodes only the rest
(`conversation.encode`). Where a template rewrites history (Qwen3 drops earlier
thinking), no text matches and encoding starts afresh: reuse goes up to the rewrite.
"""

from collections import OrderedDict

from ..conversation import Exchange

MAX_EXCHANGES = 256


class History:
    """The most recent answers' exchanges (prompt text + answer text, and ids)."""

    def __init__(self, size: int = MAX_EXCHANGES):
        self.size = size
        self._exchanges: OrderedDict[str, Exchange] = OrderedDict()

    def __len__(self) -> int:
        return len(self._exchanges)

    def find(self, text: str) -> Exchange | None:
        """The longest kept exchange whose text `text` starts with."""
        best = None
        for exchange in self._exchanges.values():
            if text.startswith(exchange.text) and (
                best is None or len(exchange.text) > len(best.text)
            ):
                best = exchange
        if best is not None:
            self._exchanges.move_to_end(best.text)
        return best

    def record(self, prompt_text: str, prompt_ids, answer: str, answer_ids) -> None:
        """A finished answer (its text as the client got it, its ids without the
        end-of-turn token)."""
        text = prompt_text + answer
        self._exchanges[text] = Exchange(text, [*prompt_ids, *answer_ids])
        self._exchanges.move_to_end(text)
        while len(self._exchanges) > self.size:
            self._exchanges.popitem(last=False)
