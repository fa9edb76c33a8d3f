"""Anthropic Messages wire format: POST /v1/messages (and /v1/messages/count_tokens)."""

import json
import uuid

from fastapi import APIRouter, Request

from . import constraints
from .bodies import read_request
from .errors import ApiError, anthropic_error
from .prompting import message_text, render_chat, skip_tools, tool_output_text
from .runner import Generation, Sampling, Waiting, start
from .schemas import CountTokensRequest, MessagesRequest, stop_list
from .sse import PING, event_stream, sse

router = APIRouter()
# `thinking.type` -> the chat template's thinking switch (None: the template's default)
THINKING = {"enabled": True, "adaptive": True, "disabled": False}


def _tool_result(block, where: str) -> dict:
    content = block.content
    if isinstance(content, list):
        content = tool_output_text(content)
    return {
        "role": "tool",
        "tool_call_id": block.tool_use_id,
        "content": content or "",
    }


def _message(m, i: int) -> list[dict]:
    """One Anthropic message as chat-template messages (tool results become 'tool')."""
    if m.role == "system":  # mid-conversation (Claude Code's beta); placed at render
        text = message_text(m.content, f"messages[{i}].content")
        return [{"role": "system", "content": text}]
    if isinstance(m.content, str):
        return [{"role": m.role, "content": m.content}]
    texts, calls, results = [], [], []
    for j, b in enumerate(m.content):
        where = f"messages[{i}].content[{j}]"
        if b.type == "text":
            texts.append(b.text or "")
        elif b.type == "tool_use":
            function = {"name": b.name, "arguments": b.input or {}}
            calls.append({"id": b.id, "type": "function", "function": function})
        elif b.type == "tool_result":
            results.append(_tool_result(b, where))
        elif b.type not in ("thinking", "redacted_thinking"):
            raise ApiError(
                400,
                f"{where} is a '{b.type}' block: this server runs a text model, send "
                "text, tool_use and tool_result blocks.",
                param=where,
            )
    out = results
    if texts or calls or not results:
        msg = {"role": m.role, "content": "".join(texts)}
        if calls:
            msg["tool_calls"] = calls
        out = out + [msg]
    return out


def chat_conversation(req: CountTokensRequest) -> tuple[list[dict], list[dict] | None]:
    """(messages, tools) for the chat template."""
    messages = []
    if req.system:
        messages.append(
            {"role": "system", "content": message_text(req.system, "system")}
        )
    for i, m in enumerate(req.messages):
        messages += _message(m, i)
    return messages, function_tools(req.tools)


def function_tools(tools) -> list[dict] | None:
    """Custom tools as chat-template function tools; Anthropic's built-in (server or
    client) tools, which the model has no schema for, are left out with a log line."""
    custom = [t for t in tools or [] if t.type in (None, "custom")]
    skip_tools(t.type for t in tools or [] if t not in custom)
    out = [
        {
            "type": "function",
            "function": {
                "name": t.name,
                "description": t.description or "",
                "parameters": t.input_schema or {"type": "object"},
            },
        }
        for t in custom
    ]
    return out or None


def _render(state, req: CountTokensRequest, thinking: bool = True):
    """The prompt and tools; `thinking` False turns the template's thinking off (a
    forced tool call holds from the answer's first token)."""
    messages, tools = chat_conversation(req)
    kwargs = {}
    asked = THINKING.get(str((req.thinking or {}).get("type")))
    if asked is not None or not thinking:
        kwargs["enable_thinking"] = bool(asked) and thinking
    return render_chat(state.tokenizer, messages, tools, kwargs, state.history), tools


def _input_arguments(args) -> dict:
    if isinstance(args, dict):
        return args
    try:
        value = json.loads(args)
    except (TypeError, json.JSONDecodeError):
        return {"arguments": args}
    return value if isinstance(value, dict) else {"arguments": value}


def stop_reason(gen: Generation) -> str:
    if gen.finish == "length":
        return "max_tokens"
    if gen.finish == "stop":
        return "stop_sequence"
    return "tool_use" if gen.text.made_tool_call else "end_turn"


def _usage(gen: Generation, output_tokens: int | None = None) -> dict:
    """Usage as Anthropic reports it: `input_tokens` are the uncached prompt tokens,
    `cache_read_input_tokens` those served from the prompt cache."""
    s = gen.stats
    return {
        "input_tokens": s.prompt_tokens - s.cached_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": s.cached_tokens,
        "output_tokens": gen.completion_tokens
        if output_tokens is None
        else output_tokens,
    }


@router.post("/v1/messages/count_tokens")
async def count_tokens(request: Request):
    state = request.app.state.server
    req = await read_request(request, CountTokensRequest)
    state.config.served_model(req.model)
    ids = _render(state, req)[0].ids
    return {"input_tokens": len(ids)}


@router.post("/v1/messages")
async def messages(request: Request):
    state = request.app.state.server
    req = await read_request(request, MessagesRequest)
    model = state.config.served_model(req.model)
    forced = constraints.forced_tool(req.tool_choice, "anthropic")
    grammar = None
    if forced is not None:
        _, tools = chat_conversation(req)
        grammar = constraints.tool_grammar(state.tokenizer, tools, forced)
    prompt, tools = _render(state, req, thinking=grammar is None)
    ids, initial = prompt.ids, prompt.state
    sampling = Sampling(
        max_tokens=req.max_tokens,
        temperature=req.temperature,
        top_p=req.top_p,
        top_k=req.top_k,
        stop=stop_list(req.stop_sequences, "stop_sequences"),
        processors=constraints.processors(state, None, grammar, req.tool_choice),
    )
    gen = start(
        state,
        ids,
        sampling,
        "messages",
        tools=tools,
        initial_state=initial,
        prompt=prompt,
    )
    head = {
        "id": f"msg_{uuid.uuid4().hex}",
        "type": "message",
        "role": "assistant",
        "model": model,
    }
    gen.request_id = head["id"]
    if req.stream:
        return event_stream(_events(gen, head))
    d = await gen.collect(request.is_disconnected)
    content = []
    if d.reasoning:
        content.append({"type": "thinking", "thinking": d.reasoning, "signature": ""})
    if d.content or not d.tool_calls:
        content.append({"type": "text", "text": d.content})
    for call in d.tool_calls:
        content.append(_tool_use(call))
    return {
        **head,
        "content": content,
        "stop_reason": stop_reason(gen),
        "stop_sequence": gen.stop_sequence,
        "usage": _usage(gen),
        "x_dflash": gen.x_dflash(),
    }


def _tool_use(call: dict) -> dict:
    return {
        "type": "tool_use",
        "id": call["id"].replace("call_", "toolu_", 1),
        "name": call["name"],
        "input": _input_arguments(call["arguments"]),
    }


class _Blocks:
    """Opens and closes content blocks as the kind of output changes."""

    def __init__(self):
        self.index, self.kind = -1, None

    def open(self, block: dict) -> list[str]:
        out = self.close()
        self.index += 1
        self.kind = block["type"]
        event = {"type": "content_block_start", "index": self.index}
        return out + [sse({**event, "content_block": block}, "content_block_start")]

    def close(self) -> list[str]:
        if self.kind is None:
            return []
        self.kind = None
        event = {"type": "content_block_stop", "index": self.index}
        return [sse(event, "content_block_stop")]

    def delta(self, kind: str, delta: dict) -> list[str]:
        out = []
        if self.kind != kind:
            empty = {"thinking": "", "signature": ""} if kind == "thinking" else {}
            out = self.open(
                {"type": kind, **({"text": ""} if kind == "text" else empty)}
            )
        event = {"type": "content_block_delta", "index": self.index, "delta": delta}
        return out + [sse(event, "content_block_delta")]


def _message_start(gen: Generation, head: dict) -> list[str]:
    message = {**head, "content": [], "stop_reason": None, "stop_sequence": None}
    start = {"type": "message_start", "message": {**message, "usage": _usage(gen, 0)}}
    return [sse(start, "message_start"), PING]


async def _events(gen: Generation, head: dict):
    # message_start waits for the prefill, so its usage splits cached and uncached
    # prompt tokens as message_delta's does; pings keep the client waiting till then
    started = False
    blocks = _Blocks()
    try:
        async for d in gen.deltas(keepalive=True):
            if isinstance(d, Waiting):
                yield PING
                continue
            events = [] if started else _message_start(gen, head)
            started = True
            if d.reasoning:
                delta = {"type": "thinking_delta", "thinking": d.reasoning}
                events += blocks.delta("thinking", delta)
            if d.content:
                events += blocks.delta(
                    "text", {"type": "text_delta", "text": d.content}
                )
            for call in d.tool_calls:
                use = _tool_use(call)
                events += blocks.open({**use, "input": {}})
                partial = json.dumps(use["input"], ensure_ascii=False)
                delta = {"type": "input_json_delta", "partial_json": partial}
                events += blocks.delta("tool_use", delta)
            for event in events:
                yield event
    except ApiError as e:
        yield sse(anthropic_error(e), "error")
        return
    for event in ([] if started else _message_start(gen, head)) + blocks.close():
        yield event
    end = {"stop_reason": stop_reason(gen), "stop_sequence": gen.stop_sequence}
    yield sse(
        {
            "type": "message_delta",
            "delta": end,
            "usage": _usage(gen),  # the final counts, cache reads included
            "x_dflash": gen.x_dflash(),
        },
        "message_delta",
    )
    yield sse({"type": "message_stop"}, "message_stop")
