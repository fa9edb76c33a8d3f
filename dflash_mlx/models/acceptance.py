"""A drafter's per-position acceptance: measured once, shipped beside its weights.

How often the target accepts the k-th draft of a block (given the ones before it were)
is a property of the drafter and the text it drafts, not of the machine. Training
measures it on its held-out prompts (the same greedy runs that give τ,
`train.loop.measure_acceptance`) and writes it to `acceptance.json` next to
`config.json`; `load_draft` reads it back as `draft.acceptance_prior`, and the adaptive
block size starts from it instead of from nothing (see engine/policy.py). Other
runtimes ignore the file.
"""

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

ACCEPTANCE_FILE = "acceptance.json"


@dataclass
class Acceptance:
    """Counts per draft position k (0-based: the (k+1)-th draft of a block)."""

    block_size: int
    # offered[k]: blocks that verified draft k+1 with drafts 1..k accepted
    offered: list[int] = field(default_factory=list)
    accepted: list[int] = field(default_factory=list)  # ... and accepted it too
    committed: int = 0  # tokens committed by all verify steps (τ's numerator)
    steps: int = 0  # verify steps, the last of each answer included (τ's denominator)
    prompts: int = 0
    source: str = ""  # what it was measured on

    def __post_init__(self):
        n = max(self.block_size - 1, 0)  # one count per draft position
        self.offered = (list(self.offered) + [0] * n)[:n]
        self.accepted = (list(self.accepted) + [0] * n)[:n]

    def add(self, response) -> None:
        """Count one `GenerationResponse` of a fixed-block-size generation."""
        if response.accepted is None:  # the prefill's token
            return
        self.committed += response.accepted
        self.steps += 1
        if response.finish_reason is not None:
            return  # the last block may be cut short by a stop token or the budget
        n_accepted, verified = response.from_draft, response.block_size
        for k in range(min(n_accepted + 1, verified - 1, len(self.offered))):
            self.offered[k] += 1
            self.accepted[k] += int(k < n_accepted)

    @property
    def tau(self) -> float:
        """Mean acceptance length: tokens committed per verify step."""
        return self.committed / self.steps if self.steps else 0.0

    def rates(self) -> list[float | None]:
        """P(draft k+1 accepted | drafts 1..k were), None where never offered."""
        return [
            a / o if o else None
            for a, o in zip(self.accepted, self.offered, strict=True)
        ]

    def to_json(self) -> str:
        record = asdict(self)
        record["tau"] = round(self.tau, 4)
        record["rates"] = [None if r is None else round(r, 4) for r in self.rates()]
        return json.dumps(record, indent=2) + "\n"


def write_acceptance(folder: Path, acceptance: Acceptance) -> Path:
    """Write `acceptance.json` into a drafter folder (atomically)."""
    from ..files import write_text

    return write_text(Path(folder) / ACCEPTANCE_FILE, acceptance.to_json())


def read_acceptance(folder: Path, what: str = "Drafter") -> Acceptance | None:
    """The folder's `acceptance.json`; None without one, a ValueError if broken."""
    file = Path(folder) / ACCEPTANCE_FILE
    if not file.is_file():
        return None
    fix = "delete it (it only speeds up the first blocks) or download the drafter again"
    try:
        record = json.loads(file.read_text())
        acceptance = Acceptance(
            block_size=int(record["block_size"]),
            offered=[int(n) for n in record["offered"]],
            accepted=[int(n) for n in record["accepted"]],
            committed=int(record.get("committed", 0)),
            steps=int(record.get("steps", 0)),
            prompts=int(record.get("prompts", 0)),
            source=str(record.get("source", "")),
        )
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{what}: '{file}' cannot be read ({e}); {fix}.") from e
    pairs = zip(acceptance.accepted, acceptance.offered, strict=True)
    if any(not 0 <= a <= o for a, o in pairs):
        raise ValueError(
            f"{what}: '{file}' counts more accepted drafts than offered ones; {fix}."
        )
    return acceptance


def pseudo_counts(prior, max_size: int, weight: float):
    """(accepted, offered) pseudo-counts per position: the prior's counts scaled so its
    first position weighs `weight` blocks; one optimistic accepted observation where the
    prior has none (no prior, or a position it never reached)."""
    accepted, offered = [1.0] * max_size, [1.0] * max_size
    if prior is None or not prior.offered or not prior.offered[0]:
        return accepted, offered
    scale = weight / prior.offered[0]
    n = min(max_size, len(prior.offered))
    for k in range(n):
        if prior.offered[k]:
            accepted[k] = prior.accepted[k] * scale
            offered[k] = prior.offered[k] * scale
    return accepted, offered
