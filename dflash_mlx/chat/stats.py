"""Numbers of a chat: one answer's (the summary line) and the session's (/stats)."""

from dataclasses import dataclass, field

from ..generate import GenerationResponse


def proposer(r: GenerationResponse) -> str | None:
    """Who proposed the tokens a block verified: the response's `source` ("draft",
    "lookup" or "splice") where the engine reports one, else "draft" for a block that
    verified more than one token; None for plain decoding."""
    if hasattr(r, "source"):  # an engine without prompt lookup has no such field
        source = getattr(r, "source", None)
        return None if source is None else str(source)
    return "draft" if r.block_size > 1 else None


@dataclass
class TurnStats:
    """Numbers for one answer (the summary line and /stats)."""

    mode: str  # "dflash" or "plain"
    block_size: int | str
    prompt_tokens: int = 0
    reused_tokens: int = 0
    prompt_tps: float = 0.0
    generation_tokens: int = 0
    generation_tps: float = 0.0
    ttft: float = 0.0  # seconds from the request to the first token
    elapsed: float = 0.0  # seconds since the request
    blocks: int = 0  # verified blocks after the first token
    accepted: int = 0  # tokens those blocks committed
    last_accepted: int | None = None
    drafted: int = 0  # committed tokens that came from the drafter
    # what the engine did, block by block: blocks with proposals verified (the rest
    # were plain decoding steps), the verify sizes used, who proposed
    drafted_blocks: int = 0
    last_block_size: int | None = None
    last_source: str | None = None
    sizes: dict[int, int] = field(default_factory=dict)
    sources: dict[str, int] = field(default_factory=dict)
    peak_memory: float = 0.0
    finish_reason: str | None = None  # "stop", "length" or "interrupted"
    speedup: float | None = None  # vs the plain tok/s measured in this session

    @property
    def mean_accepted(self) -> float | None:
        return self.accepted / self.blocks if self.blocks else None

    def add(self, r: GenerationResponse, elapsed: float):
        if r.accepted is None:
            self.ttft = elapsed
            self.prompt_tokens, self.reused_tokens = r.prompt_tokens, r.reused_tokens
            self.prompt_tps = r.prompt_tps
        else:
            self.blocks += 1
            self.accepted += r.accepted
            self.last_accepted = r.accepted
            self._count_block(r)
        self.drafted += r.from_draft
        self.generation_tokens = r.generation_tokens
        self.generation_tps = r.generation_tps
        self.peak_memory, self.elapsed = r.peak_memory, elapsed

    def _count_block(self, r: GenerationResponse):
        source = proposer(r)
        self.last_block_size, self.last_source = r.block_size, source
        self.sizes[r.block_size] = self.sizes.get(r.block_size, 0) + 1
        if source is not None:
            self.drafted_blocks += 1
            self.sources[source] = self.sources.get(source, 0) + 1

    @property
    def plain_blocks(self) -> int:
        return self.blocks - self.drafted_blocks


def baseline_tps(turns: list[TurnStats]) -> float | None:
    """Mean plain-decoding tok/s over `turns` (those with a few tokens at least)."""
    plain = [
        t.generation_tps
        for t in turns
        if t.mode == "plain" and t.generation_tokens >= 8
    ]
    return sum(plain) / len(plain) if plain else None


def totals(turns: list[TurnStats]) -> dict:
    """What /stats shows about the answers so far."""
    dflash = [t for t in turns if t.mode == "dflash"]
    blocks = sum(t.blocks for t in dflash)
    accepted = sum(t.accepted for t in dflash)
    rates = [t.generation_tps for t in dflash if t.generation_tokens]
    return {
        "turns": len(turns),
        "generated_tokens": sum(t.generation_tokens for t in turns),
        "mean_acceptance": accepted / blocks if blocks else None,
        "blocks": blocks,
        "drafted_blocks": sum(t.drafted_blocks for t in dflash),
        "dflash_tps": sum(rates) / len(rates) if rates else None,
        "plain_tps": baseline_tps(turns),
        "last_ttft": turns[-1].ttft if turns else None,
        "peak_memory": max((t.peak_memory for t in turns), default=0.0),
    }
