"""A corpus of the target's own responses that outlives one training run.

Regenerating responses is most of a drafter's training time on a small machine, so a
corpus keeps them compactly (response token ids per prompt id, gzip JSON lines, plus
how they were made) in a folder that can be committed and grown from session to session:
`dflash-mlx train --corpus DIR` first takes every response the corpus already holds
for its prompts, generates only the missing ones, and writes them all back.
"""

import gzip
import json
import os
from pathlib import Path

from .data import Prompt, encode_chat, read_samples

RESPONSES = "responses.jsonl.gz"
META = "meta.json"


def _check_meta(folder: Path, meta: dict):
    file = folder / META
    if not file.exists():
        return
    old = json.loads(file.read_text())
    diff = {k: (old.get(k), v) for k, v in meta.items() if old.get(k) != v}
    if diff:
        raise ValueError(
            f"The corpus in {folder} was made with other settings {diff} (corpus, "
            "now): pass the same --target/--temperature/--max-new-tokens, or another "
            "--corpus folder."
        )


def read_corpus(folder: Path) -> dict[str, dict]:
    """Prompt id -> {"response": ids, "finish": reason} for every stored response."""
    file = folder / RESPONSES
    if not file.exists():
        return {}
    with gzip.open(file, "rt", encoding="utf-8") as f:
        return {r["id"]: r for r in map(json.loads, f) if r.get("response")}


def seed_cache(
    folder, meta: dict, prompts: list[Prompt], tokenizer, cache: Path
) -> int:
    """Append the corpus's responses for `prompts` that `cache` (a run's
    responses.jsonl) lacks; returns how many it added."""
    folder = Path(folder)
    _check_meta(folder, meta)
    stored = read_corpus(folder)
    have = {s.id for s in read_samples(cache)}
    added = 0
    cache.parent.mkdir(parents=True, exist_ok=True)
    with open(cache, "a", encoding="utf-8") as out:
        for p in prompts:
            r = stored.get(p.id)
            if r is None or p.id in have:
                continue
            record = {"id": p.id, "prompt": encode_chat(tokenizer, p.messages),
                      "response": r["response"], "finish": r.get("finish")}  # fmt: skip
            out.write(json.dumps(record) + "\n")
            added += 1
    return added


def write_corpus(folder, meta: dict, cache: Path) -> int:
    """Merge a run's responses into the corpus (atomically); returns its size."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    _check_meta(folder, meta)
    merged = read_corpus(folder)
    for s in read_samples(cache):
        merged.setdefault(s.id, {"id": s.id, "response": s.response})
    tmp = folder / f".{RESPONSES}.tmp"
    with gzip.open(tmp, "wt", encoding="utf-8", compresslevel=9) as f:
        for key in sorted(merged):
            r = merged[key]
            row = {"id": r["id"], "response": r["response"]}
            if r.get("finish"):
                row["finish"] = r["finish"]
            f.write(json.dumps(row, separators=(",", ":")) + "\n")
    os.replace(tmp, folder / RESPONSES)
    (folder / META).write_text(json.dumps(meta, indent=2) + "\n")
    return len(merged)


def corpus_meta(target: str, temperature: float, max_new_tokens: int) -> dict:
    """How responses were made; the target by file or folder name (not by path)."""
    return {
        "target": Path(str(target)).name,
        "temperature": temperature,
        "max_new_tokens": max_new_tokens,
    }
