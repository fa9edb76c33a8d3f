"""What a request asks of the distribution beyond temperature and the filters: the
penalties, `logit_bias`, a response format (a JSON schema) and a forced tool call, as
logits processors the engine applies at every verified position (exact under
speculation: engine/processors.py). Bad values are 400s naming the field."""

import json
import logging

from ..structured import Grammars, GrammarSpec
from .errors import ApiError
from .tool_grammars import tool_grammar

__all__ = ["forced_tool", "penalties", "processors", "response_format", "tool_grammar"]

LOGIT_BIAS_LIMIT = 100.0  # OpenAI's range for a bias value
log = logging.getLogger("dflash_mlx.serve")


def penalties(state, body) -> list:
    """mlx-lm's processors for a body's presence/frequency/repetition penalties and
    logit_bias (over the last 20 tokens, prompt included, as mlx-lm's server)."""
    from mlx_lm.sample_utils import make_logits_processors

    presence = _number(body, "presence_penalty", -2.0, 2.0)
    frequency = _number(body, "frequency_penalty", -2.0, 2.0)
    repetition = _number(body, "repetition_penalty", 0.0, None)
    if repetition is not None and repetition <= 0:
        raise ApiError(
            400,
            "'repetition_penalty' must be > 0 (1: off).",
            param="repetition_penalty",
        )
    bias = logit_bias(getattr(body, "logit_bias", None), state.target.vocab_size)
    return make_logits_processors(
        logit_bias=bias,
        repetition_penalty=None if repetition in (None, 1) else repetition,
        presence_penalty=presence or None,
        frequency_penalty=frequency or None,
    )


def _number(body, name: str, low: float, high: float | None) -> float | None:
    value = getattr(body, name, None)
    if value is None:
        return None
    if not low <= value <= (high if high is not None else float("inf")):
        bound = f"in [{low:g}, {high:g}]" if high is not None else f">= {low:g}"
        raise ApiError(400, f"'{name}' must be {bound}, got {value}.", param=name)
    return float(value)


def logit_bias(bias: dict | None, vocab_size: int) -> dict[int, float] | None:
    """{token id: bias} from the body's {"id": bias}; 400 for an id outside the
    vocabulary or a bias outside [-100, 100]."""
    if not bias:
        return None
    out = {}
    for key, value in bias.items():
        try:
            token = int(key)
        except (TypeError, ValueError):
            token = -1
        if not 0 <= token < vocab_size:
            raise ApiError(
                400,
                f"'logit_bias' key {key!r} is not a token id of this model (0 to "
                f"{vocab_size - 1}).",
                param="logit_bias",
            )
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ApiError(
                400, f"'logit_bias' values must be numbers, got {value!r}.",
                param="logit_bias",
            )  # fmt: skip
        if not -LOGIT_BIAS_LIMIT <= value <= LOGIT_BIAS_LIMIT:
            raise ApiError(
                400,
                f"'logit_bias' values must be in [-100, 100], got {value}.",
                param="logit_bias",
            )
        out[token] = float(value)
    return out


def response_format(fmt, param: str = "response_format") -> GrammarSpec | None:
    """The grammar of OpenAI's `response_format` (or Responses' `text.format`):
    None for text, any JSON object, or a JSON schema (strict or not: both enforced)."""
    if fmt is None:
        return None
    if not isinstance(fmt, dict):
        raise ApiError(400, f"'{param}' must be an object.", param=param)
    kind = fmt.get("type", "text")
    if kind == "text":
        return None
    if kind == "json_object":
        return GrammarSpec.json_object()
    if kind == "json_schema":
        inner = fmt.get("json_schema", fmt)  # chat nests it; Responses does not
        schema = inner.get("schema") if isinstance(inner, dict) else None
        if schema is None:
            raise ApiError(
                400,
                f"'{param}' of type json_schema needs a 'schema': add the JSON schema.",
                param=param,
            )
        try:
            return GrammarSpec.json_schema(schema, f"{param} schema")
        except ValueError as e:
            raise ApiError(400, str(e), param=param) from None
    raise ApiError(
        400,
        f"'{param}' type {kind!r} is not supported: use text, json_object or "
        "json_schema.",
        param=param,
    )


def forced_tool(choice, api: str) -> str | None:
    """The tool a `tool_choice` forces: a name, "*" for any, None for none forced.

    OpenAI chat: "required" or {"type": "function", "function": {"name": ...}};
    Responses: "required" or {"type": "function", "name": ...}; Anthropic:
    {"type": "any"} or {"type": "tool", "name": ...}."""
    if choice is None or choice in ("auto", "none"):
        return None
    if choice == "required":
        return "*"
    if isinstance(choice, dict):
        kind = choice.get("type")
        if kind in ("auto", "none"):
            return None
        if kind == "any":
            return "*"
        name = choice.get("name")
        if name is None and isinstance(choice.get("function"), dict):
            name = choice["function"].get("name")
        if kind in ("function", "tool") and isinstance(name, str):
            return name
    raise ApiError(
        400,
        f"'tool_choice' {json.dumps(choice)[:80]} is not one this API takes: "
        + {
            "anthropic": 'use {"type": "auto"}, {"type": "any"} or {"type": "tool", '
            '"name": ...}.',
            "responses": 'use "auto", "required", "none" or {"type": "function", '
            '"name": ...}.',
        }.get(
            api,
            'use "auto", "required", "none" or {"type": "function", "function": '
            '{"name": ...}}.',
        ),
        param="tool_choice",
    )


def processors(
    state, body=None, grammar: GrammarSpec | None = None, tool_choice=None
) -> tuple:
    """The request's processors: penalties and bias from `body` (None: none), then
    `grammar`'s mask, and with `tool_choice` "none" a ban on opening a tool call;
    400 when the grammar library rejects the grammar."""
    out = list(penalties(state, body)) if body is not None else []
    if tool_choice == "none" or (
        isinstance(tool_choice, dict) and tool_choice.get("type") == "none"
    ):
        out += no_tool_calls(state.tokenizer)
    if grammar is not None:
        try:
            out.append(grammars(state).processor(grammar))
        except ValueError as e:
            raise ApiError(400, str(e), param=_param(grammar)) from None
    if out and getattr(state.target, "group", None) is not None:
        raise ApiError(
            400,
            "Penalties, logit_bias, response formats and tool_choice are not "
            "supported on a target sharded over ranks: leave them out.",
        )
    return tuple(out)


def no_tool_calls(tokenizer) -> list:
    """A processor that never lets the model open a tool call (`tool_choice` "none"),
    where the call opens with one token of its own; else none (a call is left to the
    model, as before)."""
    from mlx_lm.sample_utils import make_logits_processors

    tokens = getattr(tokenizer, "tool_call_start_tokens", None)
    if not getattr(tokenizer, "has_tool_calling", False) or not tokens:
        return []
    if len(tokens) != 1:
        log.warning("tool_choice 'none' not enforced: the tool-call tag is text")
        return []
    return make_logits_processors(logit_bias={tokens[0]: float("-inf")})


def _param(spec: GrammarSpec) -> str:
    return "tool_choice" if spec.name == "tool schema" else spec.name.split()[0]


def grammars(state) -> Grammars:
    """The server's grammar compiler for its tokenizer (built on first use)."""
    if state.grammars is None:
        try:
            state.grammars = Grammars(state.tokenizer, state.target.vocab_size)
        except ValueError as e:
            raise ApiError(400, str(e)) from None
    return state.grammars
