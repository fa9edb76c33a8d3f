"""One answer as it is generated: the text pieces the UI colours, its statistics, and
the text and ids the history keeps."""

import time
from dataclasses import dataclass
from typing import NamedTuple

from ..conversation import THINK_CLOSE, THINK_OPEN
from ..generate import GenerationResponse
from .stats import TurnStats


class Piece(NamedTuple):
    """Text of one committed token, with where it came from."""

    text: str
    drafted: bool  # proposed by the drafter and accepted (else sampled by the target)
    thinking: bool  # inside <think>...</think>


@dataclass
class Chunk:
    """One verified block as the UI needs it."""

    response: GenerationResponse
    pieces: list[Piece]
    stats: TurnStats

    @property
    def text(self) -> str:
        return "".join(p.text for p in self.pieces)


class ThinkTracker:
    """Cuts each response's token texts into pieces at <think> and </think>."""

    def __init__(self, thinking: bool):
        self.thinking = thinking  # inside a <think> block now

    def pieces(self, r: GenerationResponse) -> list[Piece]:
        pieces = []
        for i, text in enumerate(r.token_texts):
            drafted = i < r.from_draft
            while text:
                tag = THINK_CLOSE if self.thinking else THINK_OPEN
                at = text.find(tag)
                if at < 0:
                    pieces.append(Piece(text, drafted, self.thinking))
                    break
                head, text = text[: at + len(tag)], text[at + len(tag) :]
                pieces.append(Piece(head, drafted, True))
                self.thinking = not self.thinking
        return pieces


class Turn:
    """Collects one answer from the engine's responses, block by block.

    `opened_thinking`: the prompt ended inside a <think> block, so the answer as the
    history keeps it starts with the "<think>\\n" the model did not generate.
    """

    def __init__(self, mode: str, block_size: int | str, opened_thinking: bool):
        self.stats = TurnStats(mode, block_size)
        self.prefix = THINK_OPEN + "\n" if opened_thinking else ""
        self._tracker = ThinkTracker(opened_thinking)
        self._parts: list[str] = []
        self.ids: list[int] = []  # generated ids, without a final stop token
        self._start = time.perf_counter()

    def add(self, r: GenerationResponse) -> Chunk:
        self.stats.add(r, time.perf_counter() - self._start)
        chunk = Chunk(r, self._tracker.pieces(r), self.stats)
        self._parts.append(chunk.text)
        self.ids += r.tokens[:-1] if r.finish_reason == "stop" else r.tokens
        if r.finish_reason:
            self.stats.finish_reason = r.finish_reason
        return chunk

    @property
    def generated_text(self) -> str:
        """The text the model generated (what follows the prompt)."""
        return "".join(self._parts)

    @property
    def content(self) -> str:
        """The assistant message for the history."""
        return self.prefix + self.generated_text
