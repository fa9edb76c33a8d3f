"""A forced tool call (`tool_choice`) as a grammar in the model's own tool-call format,
the one mlx-lm's tool parser for the model reads back: JSON in `<tool_call>` tags
(`json_tools`: Qwen3, Hermes) or XML parameters in them (`qwen3_coder`: Qwen3.5,
Qwen3-Coder). The call's arguments follow the tool's `parameters` schema."""

import json
import logging

from ..structured import GrammarSpec
from .errors import ApiError

log = logging.getLogger("dflash_mlx.serve")
# schema types mlx-lm's qwen3_coder parser keeps as the raw text of a parameter
_TEXT_TYPES = {"string", "str", "text", "varchar", "char", "enum"}


def tool_grammar(
    tokenizer, tools: list[dict] | None, forced: str
) -> GrammarSpec | None:
    """A grammar for one call of the forced tool (any sent tool for "*"), in the
    model's tool-call format; 400 for a tool that was not sent. None (the choice is
    left to the model, with a log line) where the format has no grammar here."""
    functions = [t["function"] for t in tools or [] if t.get("function")]
    names = [f["name"] for f in functions]
    if forced != "*" and forced not in names:
        sent = ", ".join(names) or "none"
        raise ApiError(
            400,
            f"'tool_choice' names the tool {forced!r}, which is not among the tools "
            f"sent ({sent}): add it to 'tools' or name one of them.",
            param="tool_choice",
        )
    if not functions:
        raise ApiError(
            400,
            "'tool_choice' asks for a tool call but no tools were sent: add 'tools'.",
            param="tool_choice",
        )
    parser = getattr(tokenizer, "tool_parser", None)
    fmt = (getattr(parser, "__module__", "") or "").rsplit(".", 1)[-1]
    start, end = tokenizer.tool_call_start, tokenizer.tool_call_end
    body = {"json_tools": _json_call, "qwen3_coder": _xml_call}.get(fmt)
    if body is None or not start or not end:
        log.warning(
            "tool_choice %r not enforced: this model's tool-call format (%s) has no "
            "grammar here",
            forced,
            fmt or "none",
        )
        return None
    chosen = [f for f in functions if forced in ("*", f["name"])]
    opening = _marker(start, getattr(tokenizer, "tool_call_start_tokens", None))
    closing = _marker(end, getattr(tokenizer, "tool_call_end_tokens", None))
    rules = [body(i, f) for i, f in enumerate(chosen)]
    calls = " | ".join(f"call{i}" for i in range(len(chosen)))
    lark = f"start: {opening} ({calls}) {closing}\n" + "".join(rules)
    return GrammarSpec("lark", lark, "tool schema")


def _json_call(i: int, function: dict) -> str:
    """`\\n{"name": ..., "arguments": {...}}\\n`, as json_tools parses it."""
    schema = {
        "type": "object",
        "properties": {
            "name": {"const": function["name"]},
            "arguments": function.get("parameters") or {"type": "object"},
        },
        "required": ["name", "arguments"],
        "additionalProperties": False,
    }
    return f'call{i}: "\\n" json{i} "\\n"\njson{i}: %json {json.dumps(schema)}\n'


def _xml_call(i: int, function: dict) -> str:
    """`\\n<function=NAME>\\n<parameter=KEY>\\nVALUE\\n</parameter>\\n...</function>\\n`,
    as qwen3_coder parses it: the schema's properties in order (the optional ones may
    be left out), text values as text, the others as JSON."""
    params = function.get("parameters") or {}
    required = set(params.get("required") or ())
    parts, rules = [], []
    for k, (key, prop) in enumerate((params.get("properties") or {}).items()):
        name = f"p{i}_{k}"
        parts.append(name if key in required else f"{name}?")
        head = json.dumps(f"<parameter={key}>\n")
        kind = str((prop or {}).get("type", "string")).lower()
        if kind in _TEXT_TYPES and "enum" not in (prop or {}):
            text = _literal(f"<parameter={key}>\n")
            regex = text + _without("</parameter>") + _literal("\n</parameter>\n")
            rules.append(f"{name}: P{i}_{k}\nP{i}_{k}: /{_lark_regex(regex)}/\n")
        elif "enum" in (prop or {}) and all(isinstance(v, str) for v in prop["enum"]):
            values = " | ".join(json.dumps(v) for v in prop["enum"])
            rules.append(f'{name}: {head} ({values}) "\\n</parameter>\\n"\n')
        else:
            schema = json.dumps(prop or {})
            rules.append(
                f'{name}: {head} v{i}_{k} "\\n</parameter>\\n"\n'
                f"v{i}_{k}: %json {schema}\n"
            )
    opening = json.dumps(f"\n<function={function['name']}>\n")
    rule = f'call{i}: {opening} {" ".join(parts)} "</function>\\n"\n'
    return rule + "".join(rules)


def _without(word: str) -> str:
    """A regex of the strings in which `word` never occurs; its first character must
    occur nowhere else in it (so each occurrence of that character starts afresh)."""
    first, rest = word[0], word[1:]
    assert first not in rest
    f = _literal(first)
    # what may follow `first` up to the next `first`: anything not starting with `rest`
    after = None
    for ch in reversed(rest):
        c = _literal(ch)
        more = "" if after is None else f"|{c}{after}"
        after = f"(?:[^{f}{c}][^{f}]*{more})?"
    return f"[^{f}]*(?:{f}{after})*"


def _literal(text: str) -> str:
    """`text` as a regex matching itself (Rust's syntax, for llguidance)."""
    return "".join(
        "\\n" if ch == "\n" else "\\" + ch if ch in "\\.+*?()|[]{}^$#&-~" else ch
        for ch in text
    )


def _lark_regex(regex: str) -> str:
    """A regex as a Lark /.../ terminal body (its slashes escaped)."""
    return regex.replace("/", "\\/")


def _marker(text: str, tokens) -> str:
    """A tool-call tag in Lark: its token by id where it is one token (a special
    token, which no text matches), else its text."""
    if tokens is not None and len(tokens) == 1:
        return f"<[{tokens[0]}]>"
    return json.dumps(text)
