"""Saving a conversation: a JSON record, or Markdown for reading."""

import json
from pathlib import Path

from .. import files
from ..conversation import split_thinking


def transcript(
    messages: list[dict],
    system: str | None,
    settings: dict,
    names: dict,
) -> dict:
    """The record `/save` writes: models, settings, and the messages with each answer's
    thinking and final text apart."""
    out = [{"role": "system", "content": system}] if system else []
    for m in messages:
        m = dict(m)
        if m["role"] == "assistant":
            m["thinking"], m["answer"] = split_thinking(m["content"])
        out.append(m)
    return {
        "model": names.get("model"),
        "draft": names.get("draft"),
        "settings": settings,
        "messages": out,
    }


def save(data: dict, path, overwrite: bool = False) -> Path:
    """Write `data` as JSON (a .json path) or Markdown, atomically; FileExistsError if
    `path` exists and not `overwrite`, a ValueError if it cannot be written."""
    path = Path(path).expanduser()
    if path.exists() and not overwrite and not path.is_dir():
        raise FileExistsError(f"{path} already exists.")
    if path.suffix.lower() == ".json":
        text = json.dumps(data, indent=2, ensure_ascii=False) + "\n"
    else:
        text = markdown(data)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        files.write_text(path, text)
    except OSError as e:
        raise ValueError(
            f"Cannot write {path} ({e.strerror or e}): choose another path."
        ) from e
    return path


def _answer_lines(m: dict) -> list[str]:
    lines = []
    if m["thinking"]:
        lines += ["<details><summary>Thinking</summary>", "", m["thinking"], ""]
        lines += ["</details>", ""]
    lines += [m["answer"], ""]
    if m.get("interrupted"):
        lines += ["*[interrupted]*", ""]
    st = m.get("stats") or {}
    if st.get("generation_tokens"):
        tau = st["accepted"] / st["blocks"] if st.get("blocks") else None
        shown_tau = f", τ {tau:.2f}" if tau and st["mode"] == "dflash" else ""
        lines += [
            f"<sub>{st['generation_tokens']} tokens, {st['generation_tps']:.1f} tok/s, "
            f"{st['mode']}{shown_tau}</sub>",
            "",
        ]
    return lines


def markdown(data: dict) -> str:
    lines = [f"# Chat with {data['model'] or 'the model'}", ""]
    if data["draft"]:
        lines += [f"Drafter: {data['draft']}", ""]
    for m in data["messages"]:
        lines += [f"## {m['role'].capitalize()}", ""]
        if m["role"] == "assistant":
            lines += _answer_lines(m)
        else:
            lines += [m["content"], ""]
    return "\n".join(lines)
