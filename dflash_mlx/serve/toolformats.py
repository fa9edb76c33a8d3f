"""How each family writes reasoning and tool calls, and the parser for its calls.

mlx-lm's own tool parsers and thinking markers come first: its tokenizer picks the
parser from the chat template (Qwen3 `<tool_call>` JSON, Qwen3.5/Qwen3-Coder XML
functions, Gemma 4, GLM, Kimi, MiniMax, ...) and the reasoning markers from the
vocabulary. Two families it has no parser for are written here: gpt-oss's harmony
channels and Llama 3.1's bare JSON calls.
"""

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class OutputFormat:
    """A family's output: the text machine that splits reasoning and tool text from
    the answer, the parser of one call's text, and the call's markers (to give a call
    that does not parse back as text)."""

    name: str
    machine: Any  # mlx_lm.generate.TextStateMachine
    parser: Callable | None
    start: str = ""
    end: str = ""
    needs_tools: bool = False  # a call only where the request declared tools


def output_format(tokenizer) -> OutputFormat:
    """The tokenizer's family format: ours for harmony and Llama 3.1 JSON, else
    mlx-lm's parser and markers."""
    from mlx_lm.generate import make_text_state_machine

    template = getattr(tokenizer, "chat_template", None)
    template = template if isinstance(template, str) else ""
    if getattr(tokenizer, "tool_parser", None) is None:  # mlx-lm's first
        if "<|channel|>" in template and "<|message|>" in template:
            return harmony()
        if "<|python_tag|>" in template:
            return llama3_json()
    return OutputFormat(
        "mlx-lm",
        make_text_state_machine(tokenizer),
        getattr(tokenizer, "tool_parser", None),
        getattr(tokenizer, "tool_call_start", None) or "",
        getattr(tokenizer, "tool_call_end", None) or "",
    )


# gpt-oss (harmony): <|channel|>analysis<|message|>...<|end|> is reasoning; a call is
# `<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{...}<|call|>`,
# or with the recipient before the channel (` to=functions.NAME<|channel|>...`)
_HARMONY = {
    "normal": [
        ("<|channel|>analysis<|message|>", "reasoning"),
        ("<|channel|>final<|message|>", "normal"),
        ("<|channel|>commentary<|message|>", "normal"),
        ("<|channel|>commentary to=", "tool"),
        (" to=functions.", "tool"),
        ("<|start|>assistant", "normal"),
        ("<|end|>", "normal"),
        ("<|return|>", "normal"),
    ],
    "reasoning": [("<|end|>", "normal")],
    "tool": [("<|call|>", "normal"), ("<|end|>", "normal")],
}
_HARMONY_CALL = re.compile(r"\s*(?:functions\.)?([^\s<]+)")


def parse_harmony_call(text: str, tools=None) -> dict:
    """`functions.NAME <|constrain|>json<|message|>{...}` -> {"name", "arguments"}."""
    head, sep, body = text.partition("<|message|>")
    found = _HARMONY_CALL.match(head)
    if not sep or not found:
        raise ValueError("no recipient or no <|message|> in a harmony call")
    return {"name": found.group(1), "arguments": _json_object(body)}


def harmony() -> OutputFormat:
    from mlx_lm.generate import TextStateMachine

    machine = TextStateMachine(_HARMONY)
    return OutputFormat("harmony", machine, parse_harmony_call)


# Llama 3.1: a call is the whole answer, `{"name": ..., "parameters": {...}}`, maybe
# after <|python_tag|>; only where the request declared tools
_LLAMA_START = '{"name"'


def parse_llama3_call(text: str, tools=None) -> dict:
    """`: "NAME", "parameters": {...}}` (after the start marker) -> a call."""
    text = text.strip()
    call = _json_object(text if text.startswith("{") else _LLAMA_START + text)
    arguments = call.get("parameters", call.get("arguments", {}))
    if not isinstance(call.get("name"), str) or not isinstance(arguments, dict):
        raise ValueError("a Llama call needs a string name and an object of parameters")
    return {"name": call["name"], "arguments": arguments}


def llama3_json() -> OutputFormat:
    from mlx_lm.generate import TextStateMachine

    machine = TextStateMachine(
        {
            "normal": [(_LLAMA_START, "tool"), ("<|python_tag|>", "tool")],
            "tool": [("<|eom_id|>", "normal")],
        }
    )
    return OutputFormat(
        "llama3-json", machine, parse_llama3_call, _LLAMA_START, "", needs_tools=True
    )


def _json_object(text: str) -> dict:
    """One JSON object and nothing after it; ValueError otherwise."""
    value, end = json.JSONDecoder().raw_decode(text.strip())
    if not isinstance(value, dict) or text.strip()[end:].strip():
        raise ValueError("not one JSON object")
    return value
