"""The chat's slash commands: a table from name to handler, and the help text.

A handler takes the session and the argument text and returns (action, message):
"help", "stats" and "exit" ask the UI to act, "info" carries a message to show. Bad
arguments raise ValueError with the usage.
"""

import math
from collections.abc import Callable

from ..validate import block_size as check_block_size

COMMANDS = {
    "/help": "show this help",
    "/reset": "forget the conversation (and its caches)",
    "/stats": "session statistics",
    "/temp X": "set the sampling temperature (0 = greedy)",
    "/block N": "set the verify block size (1 = plain decoding)",
    "/max N": "set the maximum tokens per answer (-1: up to the context)",
    "/draft on|off": "speculative decoding on, or plain decoding to compare",
    "/render on|off": "answers as rendered Markdown, or raw text (also --plain)",
    "/color on|off": "colour tokens by source (drafted vs target; raw text)",
    "/save PATH": "save the transcript (.json, otherwise Markdown)",
    "/save! PATH": "save it over an existing file",
    "/exit": "leave (also Ctrl-D)",
}


def _number(arg: str, kind, example: str):
    try:
        value = kind(arg)
    except ValueError:
        raise ValueError(f"Expected a number, e.g. {example}") from None
    if not math.isfinite(value):
        raise ValueError(f"Expected a finite number, e.g. {example}")
    return value


def _on_off(arg: str, usage: str) -> bool:
    if arg not in ("on", "off"):
        raise ValueError(f"Usage: {usage} on  or  {usage} off")
    return arg == "on"


def _reset(session, arg):
    session.reset()
    return "info", "Conversation and caches cleared."


def _temp(session, arg):
    value = _number(arg, float, "/temp 0.7")
    if value < 0:
        raise ValueError(
            "Temperature must be >= 0: /temp 0 for greedy, /temp 0.7 to sample."
        )
    session.settings.temperature = value
    return "info", f"Temperature {value:g}" + (" (greedy)." if value == 0 else ".")


def _block(session, arg):
    if arg == "auto":
        if session.draft is None:
            raise ValueError("No drafter loaded: restart with --draft to use blocks.")
        session.settings.block_size = "auto"
        return "info", "Block size chosen per block from measured speed (auto)."
    value = _number(arg, int, "/block 16")
    if value < 1:
        raise ValueError("Block size must be >= 1: /block 16 (1 = plain decoding).")
    if session.draft is None and value > 1:
        raise ValueError("No drafter loaded: restart with --draft to use blocks > 1.")
    largest = session.draft.args.block_size if session.draft is not None else None
    size, capped = check_block_size(value, largest)
    session.settings.block_size = size
    if capped:
        return (
            "info",
            f"Block size {size}, the drafter's largest ({value} is above it).",
        )
    return "info", f"Block size {size}."


def _max(session, arg):
    value = _number(arg, int, "/max 512")
    if value == 0 or value < -1:
        raise ValueError(
            "Max tokens must be positive, or -1 for up to the context: /max 512"
        )
    session.settings.max_tokens = value
    return "info", f"Max tokens {value}."


def _draft(session, arg):
    on = _on_off(arg, "/draft")
    if on and session.draft is None:
        raise ValueError("No drafter loaded: restart with --draft <drafter> to use it.")
    session.settings.draft_on = on
    if on:
        return "info", "Speculative decoding on."
    return "info", "Plain decoding (the drafter's cache stays in sync for /draft on)."


def _color(session, arg):
    session.settings.color = _on_off(arg, "/color")
    if session.settings.color and session.settings.markdown:
        return "info", "Token colours on (answers show as raw text while they are)."
    return "info", "Token colours " + arg + "."


def _render(session, arg):
    session.settings.markdown = _on_off(arg, "/render")
    if not session.settings.markdown:
        return "info", "Answers as raw text."
    if session.settings.color:
        return (
            "info",
            "Markdown rendering on once /color is off (colours are raw text).",
        )
    return "info", "Answers rendered as Markdown."


def _save(session, arg, overwrite: bool = False):
    if not arg:
        raise ValueError("Usage: /save chat.md  or  /save chat.json")
    try:
        path = session.save(arg, overwrite)
    except FileExistsError:
        raise ValueError(
            f"{arg} already exists: /save! {arg} replaces it, or choose another name."
        ) from None
    return "info", f"Saved {len(session.messages)} messages to {path}."


HANDLERS: dict[str, Callable] = {
    "/exit": lambda session, arg: ("exit", ""),
    "/quit": lambda session, arg: ("exit", ""),
    "/help": lambda session, arg: ("help", ""),
    "/stats": lambda session, arg: ("stats", ""),
    "/reset": _reset,
    "/temp": _temp,
    "/block": _block,
    "/max": _max,
    "/draft": _draft,
    "/color": _color,
    "/render": _render,
    "/save": _save,
    "/save!": lambda session, arg: _save(session, arg, overwrite=True),
}


def run_command(session, line: str) -> tuple[str, str]:
    """Apply the slash command `line` to `session`: (action, message)."""
    name, _, arg = line.strip().partition(" ")
    name, arg = name.lower(), arg.strip()
    handler = HANDLERS.get(name)
    if handler is None:
        raise ValueError(f"Unknown command {name}: /help lists the commands.")
    return handler(session, arg)
