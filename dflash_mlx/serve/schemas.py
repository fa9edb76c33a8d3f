"""Request bodies of the OpenAI, Anthropic and Responses APIs, with their field names.

Types are strict (a string where a number belongs is an error, not a guess); fields the
server does not use are ignored, since clients send many vendor extras.
"""

from collections.abc import Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from .errors import ApiError


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)


# -- OpenAI chat completions and completions --------------------------------------
class ContentPart(_Body):
    type: str
    text: str | None = None


class FunctionCall(_Body):
    name: str
    arguments: str | dict = "{}"


class ToolCall(_Body):
    id: str | None = None
    type: str = "function"
    function: FunctionCall


class ChatMessage(_Body):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    reasoning_content: str | None = None


class FunctionSpec(_Body):
    name: str
    description: str | None = None
    parameters: dict | None = None


class ToolSpec(_Body):
    type: str = "function"
    function: FunctionSpec | None = None  # built-in tools (web_search...) have none


class StreamOptions(_Body):
    include_usage: bool = False


class SamplingBody(_Body):
    """Fields shared by chat completions and completions."""

    model: str | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    max_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, ge=0, le=1)
    top_k: int | None = Field(None, ge=0)
    min_p: float | None = Field(None, ge=0, le=1)
    seed: int | None = None
    stop: str | list[str] | None = None
    n: int = Field(1, ge=1, le=1)
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    repetition_penalty: float | None = None
    logit_bias: dict | None = None
    response_format: dict | None = None

    def stop_strings(self) -> tuple[str, ...]:
        return stop_list(self.stop, "stop")


class ChatCompletionRequest(SamplingBody):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)
    tools: list[ToolSpec] | None = None
    tool_choice: Any = None
    chat_template_kwargs: dict | None = None
    enable_thinking: bool | None = None
    reasoning_effort: str | None = None  # "none"/"minimal": thinking off


class CompletionRequest(SamplingBody):
    prompt: str | list[int] | list[str]
    logprobs: int | None = Field(None, ge=0, le=20)
    echo: bool = False


# -- Anthropic messages -----------------------------------------------------------
class AnthropicBlock(_Body):
    type: str
    text: str | None = None
    id: str | None = None
    name: str | None = None
    input: dict | None = None
    tool_use_id: str | None = None
    content: str | list[dict] | None = None
    is_error: bool | None = None


class AnthropicMessage(_Body):
    role: Literal["user", "assistant", "system"]  # system: mid-conversation (beta)
    content: str | list[AnthropicBlock]


class AnthropicTool(_Body):
    type: str | None = None  # None or "custom"; others are Anthropic's built-in tools
    name: str
    description: str | None = None
    input_schema: dict | None = None


class CountTokensRequest(_Body):
    """What a prompt is made of (POST /v1/messages/count_tokens)."""

    model: str | None = None
    messages: list[AnthropicMessage] = Field(min_length=1)
    system: str | list[AnthropicBlock] | None = None
    tools: list[AnthropicTool] | None = None
    tool_choice: Any = None
    thinking: dict | None = None


class MessagesRequest(CountTokensRequest):
    max_tokens: int = Field(ge=1)  # above the server's cap: clamped to it
    temperature: float | None = Field(None, ge=0, le=1)
    top_p: float | None = Field(None, ge=0, le=1)
    top_k: int | None = Field(None, ge=0)
    stop_sequences: list[str] | None = None
    stream: bool = False


# -- OpenAI Responses (stateless) -------------------------------------------------
class ResponsesRequest(_Body):
    model: str | None = None
    input: str | list[dict]
    instructions: str | None = None
    max_output_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, ge=0, le=1)
    stream: bool = False
    tools: list[dict] | None = None
    tool_choice: Any = None
    previous_response_id: str | None = None
    reasoning: dict | None = None
    text: dict | None = None  # {"format": {"type": "json_schema", ...}}


def stop_list(stop: str | list[str] | None, field: str) -> tuple[str, ...]:
    """Stop strings as a tuple, with a fix-it error for empty or too many."""
    stops = [stop] if isinstance(stop, str) else list(stop or [])
    if len(stops) > 16:
        raise ApiError(400, f"'{field}' takes at most 16 strings.", param=field)
    if any(not s for s in stops):
        raise ApiError(400, f"'{field}' strings must not be empty.", param=field)
    return tuple(stops)


def _param(errors: Sequence[Any]) -> str:
    """The field at fault (a union's failures share it as a common prefix)."""
    first = errors[0]["loc"]
    same = [e["loc"] for e in errors if e["loc"][:1] == first[:1]]
    prefix = list(first)
    for loc in same[1:]:
        n = 0
        while n < min(len(prefix), len(loc)) and prefix[n] == loc[n]:
            n += 1
        prefix = prefix[:n]
    return ".".join(str(p) for p in prefix) or "body"


def parse_body(model: type[BaseModel], data) -> BaseModel:
    """Validate decoded JSON against `model`; a 400 `ApiError` naming the bad field."""
    if not isinstance(data, dict):
        raise ApiError(400, "The request body must be a JSON object.")
    try:
        return model.model_validate(data)
    except ValidationError as e:
        errors = e.errors(include_url=False)
        param = _param(errors)
        first = errors[0]
        if first["type"] == "missing":
            message = f"'{param}' is required: add it to the request body."
        else:
            message = f"Invalid '{param}': {first['msg'].lower()}."
        raise ApiError(400, message, param=param) from None
