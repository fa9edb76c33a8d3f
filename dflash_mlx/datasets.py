"""Benchmark prompt sets: the five of the DFlash paper and `code-edits` (code pasted
back with a small change asked for: where prompt lookup pays), bundled with the
package, or a custom JSONL file.

Prompts are formatted as the reference DFlash benchmark formats them (see
data/SOURCES.md), and samples are drawn the same way (a `random.Random(seed)` shuffle,
then the first N). `all` is the paper's five.
"""

import gzip
import json
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

DATA_DIR = Path(__file__).parent / "data"
_REASON = "\nPlease reason step by step, and put your final answer within \\boxed{}."


@dataclass(frozen=True)
class Sample:
    """One benchmark item: the user turns of a conversation (one for most sets)."""

    dataset: str
    id: str
    turns: tuple[str, ...]
    answer: str | None = None  # the reference answer where the set has one


@dataclass(frozen=True)
class _Spec:
    file: str
    id_key: str
    turns: Callable[[dict], list[str]]
    answer_key: str | None = None
    keep: Callable[[dict], bool] = lambda row: True


BUNDLED = {
    "gsm8k": _Spec(
        "gsm8k_test.jsonl.gz", "", lambda r: [r["question"] + _REASON], "answer"
    ),
    "math500": _Spec(
        "math500_test.jsonl.gz",
        "unique_id",
        lambda r: [r["problem"] + _REASON],
        "answer",
    ),
    "humaneval": _Spec(
        "humaneval.jsonl.gz",
        "task_id",
        lambda r: [
            "Write a solution to the following problem and make sure that it passes "
            "the "
            f"tests:\n```python\n{r['prompt']}\n```"
        ],
        "canonical_solution",
    ),
    "mbpp": _Spec(
        "mbpp_sanitized.jsonl.gz",
        "task_id",
        lambda r: [r["prompt"]],
        "code",
        keep=lambda r: 11 <= int(r["task_id"]) <= 510,
    ),
    "mt-bench": _Spec("mt_bench.jsonl.gz", "question_id", lambda r: list(r["turns"])),
    # written by examples/make_code_edits.py from stdlib functions (data/SOURCES.md)
    "code-edits": _Spec("code_edits.jsonl.gz", "id", lambda r: [r["prompt"]]),
}
DATASETS = ("gsm8k", "math500", "humaneval", "mbpp", "mt-bench")  # `all`
NAMES = ", ".join(BUNDLED)


def read_jsonl_gz(path: Path) -> list[dict]:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def bundled(name: str) -> list[Sample]:
    """Every sample of a bundled set, in file order."""
    spec = BUNDLED[name]
    samples = []
    for i, row in enumerate(read_jsonl_gz(DATA_DIR / spec.file)):
        if not spec.keep(row):
            continue
        sid = str(row[spec.id_key]) if spec.id_key else f"{name}/{i}"
        answer = row.get(spec.answer_key) if spec.answer_key else None
        samples.append(Sample(name, sid, tuple(spec.turns(row)), answer))
    return samples


def _custom_turns(row, where: str) -> list[str]:
    if isinstance(row, str):
        return [row]
    if isinstance(row, dict):
        if isinstance(row.get("turns"), list):
            turns = row["turns"]
        elif isinstance(row.get("prompt"), str):
            turns = [row["prompt"]]
        else:
            turns = None
        if turns and all(isinstance(t, str) and t for t in turns):
            return turns
    raise ValueError(
        f'{where}: each line must be a JSON string, {{"prompt": "..."}} or '
        '{"turns": ["first user turn", "second user turn"]}.'
    )


def load_jsonl(path: str | Path) -> list[Sample]:
    """A custom prompt file: one JSON value per line, a string, `prompt` or `turns`."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise ValueError(
            f"Prompt file '{path}' does not exist. Pass one of "
            f"{NAMES}, 'all', or a .jsonl file of prompts."
        )
    opener = gzip.open if path.suffix == ".gz" else open
    samples = []
    with opener(path, "rt", encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            where = f"{path}, line {n}"
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{where} is not valid JSON ({e}).") from e
            sid = str(row.get("id", n)) if isinstance(row, dict) else str(n)
            answer = row.get("answer") if isinstance(row, dict) else None
            samples.append(
                Sample(path.stem, sid, tuple(_custom_turns(row, where)), answer)
            )
    if not samples:
        raise ValueError(f"Prompt file '{path}' has no prompts.")
    return samples


def select(
    samples: list[Sample], max_samples: int | None, seed: int = 42
) -> list[Sample]:
    """The reference benchmark's draw: shuffle indices with `seed`, keep the first N."""
    order = list(range(len(samples)))
    random.Random(seed).shuffle(order)
    n = len(order) if max_samples is None else min(max_samples, len(order))
    return [samples[i] for i in order[:n]]


def resolve(spec: str) -> list[str]:
    """`--dataset` value → names/paths: a name, `all`, a path, or a comma list."""
    out: list[str] = []
    for part in (p.strip() for p in spec.split(",")):
        if not part:
            continue
        if part == "all":
            out.extend(DATASETS)
        elif (
            part in BUNDLED
            or part.endswith((".jsonl", ".jsonl.gz"))
            or Path(part).expanduser().is_file()
        ):
            out.append(part)
        else:
            raise ValueError(
                f"Unknown dataset '{part}'. Choose from {NAMES}, "
                "'all', or give a path to a .jsonl file of prompts."
            )
    if not out:
        raise ValueError(
            "No dataset given: pass --dataset gsm8k (or all, or a .jsonl file)."
        )
    return list(dict.fromkeys(out))


def load_dataset(
    name: str, max_samples: int | None = None, seed: int = 42
) -> list[Sample]:
    """Samples of a bundled set (by name) or of a custom JSONL file (by path)."""
    samples = bundled(name) if name in BUNDLED else load_jsonl(name)
    return select(samples, max_samples, seed)
