"""Saving a conversation: a JSON record, or Markdown for reading."""

import json
from pathlib import Path

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


def save(data: dict, path) -> Path:
    """Write `data` as JSON (a .json path) or Markdown; a ValueError if it cannot."""
    path = Path(path).expanduser()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.suffix.lower() == ".json":
            path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n")
        else:
            path.write_text(markdown(data))
    except OSError as e:
        raise ValueError(
            f"Cannot write {path} ({e.strerror}): choose another path."
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
