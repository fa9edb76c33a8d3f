"""OpenAI API: GET /v1/models, POST /v1/chat/completions and /v1/completions."""

import json
import time
import uuid
from typing import Any

from fastapi import APIRouter, Request

from .. import __version__
from ..structured import DEAD_END
from . import constraints
from .bodies import read_request
from .errors import ApiError, openai_error
from .prompting import chat_messages, completion_prompt, render_chat, tool_specs
from .runner import Generation, Sampling, Waiting, start
from .schemas import ChatCompletionRequest, CompletionRequest
from .sse import DONE, comment, event_stream, sse

router = APIRouter()
FINGERPRINT = f"dflash-mlx-{__version__}"


@router.get("/v1/models")
async def list_models(request: Request):
    state = request.app.state.server
    cfg = state.config
    return {
        "object": "list",
        "data": [
            {
                "id": cfg.model_id,
                "object": "model",
                "created": int(time.time()),
                "owned_by": "dflash-mlx",
                "x_dflash": {"draft": cfg.draft_id},
            }
        ],
    }


def _head(prefix: str, model: str, kind: str) -> dict:
    return {
        "id": f"{prefix}-{uuid.uuid4().hex}",
        "object": kind,
        "created": int(time.time()),
        "model": model,
        "system_fingerprint": FINGERPRINT,
    }


def _token_text(tokenizer, token: int) -> dict:
    text = tokenizer.decode([token])
    return {"token": text, "bytes": list(text.encode("utf-8"))}


def chat_logprobs(tokenizer, entries, top: int) -> dict:
    """`choices[].logprobs` of a chat completion."""
    content = []
    for e in entries:
        alternatives = [
            {**_token_text(tokenizer, t), "logprob": lp} for t, lp in e.top[:top]
        ]
        content.append(
            {
                **_token_text(tokenizer, e.token),
                "logprob": e.logprob,
                "top_logprobs": alternatives,
            }
        )
    return {"content": content}


def tool_calls(calls: list[dict], first_index: int | None = None) -> list[dict]:
    """Parsed calls as OpenAI `tool_calls`; streamed ones carry their `index`."""
    out = []
    for i, call in enumerate(calls):
        args = call["arguments"]
        item = {
            "id": call["id"],
            "type": "function",
            "function": {
                "name": call["name"],
                "arguments": args
                if isinstance(args, str)
                else json.dumps(args, ensure_ascii=False),
            },
        }
        if first_index is not None:
            item["index"] = first_index + i
        out.append(item)
    return out


def finish_reason(gen: Generation) -> str:
    if gen.finish in ("length", DEAD_END):
        return gen.finish
    return "tool_calls" if gen.text.made_tool_call else "stop"


def _sampling(state, req, logprobs: int, grammar=None) -> Sampling:
    return Sampling(
        max_tokens=getattr(req, "max_completion_tokens", None) or req.max_tokens,
        temperature=req.temperature,
        top_p=req.top_p,
        top_k=req.top_k,
        min_p=req.min_p,
        seed=req.seed,
        stop=req.stop_strings(),
        logprobs=logprobs,
        processors=constraints.processors(
            state, req, grammar, getattr(req, "tool_choice", None)
        ),
    )


@router.post("/v1/chat/completions")
async def chat_completions(request: Request):
    state = request.app.state.server
    req = await read_request(request, ChatCompletionRequest)
    model = state.config.served_model(req.model)
    template_kwargs = _template_kwargs(req)
    tools = tool_specs(req.tools)
    grammar = constraints.response_format(req.response_format)
    forced = constraints.forced_tool(req.tool_choice, "openai")
    if forced is not None:
        grammar = constraints.tool_grammar(state.tokenizer, tools, forced)
    if grammar is not None:  # the grammar holds from the answer's first token
        template_kwargs["enable_thinking"] = False
    prompt = render_chat(
        state.tokenizer,
        chat_messages(req.messages),
        tools,
        template_kwargs,
        state.history,
    )
    ids, initial = prompt.ids, prompt.state
    top = req.top_logprobs or 0
    sampling = _sampling(state, req, max(top, 1) if req.logprobs else 0, grammar)
    gen = start(
        state,
        ids,
        sampling,
        "chat",
        tools=tools,
        initial_state=initial,
        prompt=prompt,
    )
    head = _head("chatcmpl", model, "chat.completion")
    gen.request_id = head["id"]
    if req.stream:
        return event_stream(_chat_chunks(gen, head, req, state.tokenizer))
    delta = await gen.collect(request.is_disconnected)
    return _chat_completion(gen, head, delta, req, state.tokenizer)


def _template_kwargs(req) -> dict:
    """The chat template's options: chat_template_kwargs, then reasoning_effort and
    enable_thinking at the top level."""
    kwargs = dict(req.chat_template_kwargs or {})
    if req.reasoning_effort is not None:
        kwargs.setdefault(
            "enable_thinking", req.reasoning_effort not in ("none", "minimal")
        )
    if req.enable_thinking is not None:
        kwargs["enable_thinking"] = req.enable_thinking
    return kwargs


def _chat_completion(gen: Generation, head: dict, delta, req, tokenizer) -> dict:
    """The whole (non-streamed) chat completion."""
    message: dict[str, Any] = {
        "role": "assistant",
        "content": delta.content if delta.content or not delta.tool_calls else None,
    }
    if delta.reasoning:
        message["reasoning_content"] = delta.reasoning
    if delta.tool_calls:
        message["tool_calls"] = tool_calls(delta.tool_calls)
    top = req.top_logprobs or 0
    logprobs = chat_logprobs(tokenizer, delta.logprobs, top) if req.logprobs else None
    choice = {
        "index": 0,
        "message": message,
        "logprobs": logprobs,
        "finish_reason": finish_reason(gen),
    }
    return {
        **head,
        "choices": [choice],
        "usage": gen.usage(),
        "x_dflash": gen.x_dflash(),
    }


async def _chat_chunks(gen: Generation, head: dict, req, tokenizer):
    head = {**head, "object": "chat.completion.chunk"}

    def chunk(delta: dict, logprobs=None, finish=None, **extra) -> str:
        choice = {
            "index": 0,
            "delta": delta,
            "logprobs": logprobs,
            "finish_reason": finish,
        }
        return sse({**head, "choices": [choice], **extra})

    yield chunk({"role": "assistant", "content": ""})
    calls = 0
    try:
        async for d in gen.deltas(keepalive=True):
            if isinstance(d, Waiting):
                yield comment(d.comment())
                continue
            out: dict[str, Any] = {}
            if d.reasoning:
                out["reasoning_content"] = d.reasoning
            if d.content:
                out["content"] = d.content
            if d.tool_calls:
                out["tool_calls"] = tool_calls(d.tool_calls, calls)
                calls += len(d.tool_calls)
            logprobs = None
            if req.logprobs and d.logprobs:
                logprobs = chat_logprobs(tokenizer, d.logprobs, req.top_logprobs or 0)
            if out or logprobs:
                yield chunk(out, logprobs)
    except ApiError as e:
        yield sse(openai_error(e))
        return
    yield chunk({}, finish=finish_reason(gen), x_dflash=gen.x_dflash())
    if req.stream_options is not None and req.stream_options.include_usage:
        yield sse({**head, "choices": [], "usage": gen.usage()})
    yield DONE


def completion_logprobs(tokenizer, entries, offset: int = 0) -> dict:
    """`choices[].logprobs` of a (legacy) text completion."""
    out: dict[str, list] = {
        "tokens": [],
        "token_logprobs": [],
        "top_logprobs": [],
        "text_offset": [],
    }
    for e in entries:
        text = tokenizer.decode([e.token])
        out["tokens"].append(text)
        out["token_logprobs"].append(e.logprob)
        out["top_logprobs"].append({tokenizer.decode([t]): lp for t, lp in e.top})
        out["text_offset"].append(offset)
        offset += len(text)
    return out


@router.post("/v1/completions")
async def completions(request: Request):
    state = request.app.state.server
    req = await read_request(request, CompletionRequest)
    model = state.config.served_model(req.model)
    if req.echo:
        raise ApiError(
            400, "'echo' is not supported: leave it out or send false.", param="echo"
        )
    ids = completion_prompt(state.tokenizer, req.prompt, state.target.vocab_size)
    grammar = constraints.response_format(req.response_format)
    sampling = _sampling(state, req, req.logprobs or 0, grammar)
    gen = start(state, ids, sampling, "completions", raw=True)
    head = _head("cmpl", model, "text_completion")
    gen.request_id = head["id"]
    if req.stream:
        return event_stream(_completion_chunks(gen, head, req, state.tokenizer))
    delta = await gen.collect(request.is_disconnected)
    logprobs = (
        completion_logprobs(state.tokenizer, delta.logprobs) if req.logprobs else None
    )
    choice = {
        "index": 0,
        "text": delta.content,
        "logprobs": logprobs,
        "finish_reason": finish_reason(gen),
    }
    return {
        **head,
        "choices": [choice],
        "usage": gen.usage(),
        "x_dflash": gen.x_dflash(),
    }


async def _completion_chunks(gen: Generation, head: dict, req, tokenizer):
    def chunk(text: str, logprobs=None, finish=None, **extra) -> str:
        choice = {
            "index": 0,
            "text": text,
            "logprobs": logprobs,
            "finish_reason": finish,
        }
        return sse({**head, "choices": [choice], **extra})

    offset = 0
    try:
        async for d in gen.deltas(keepalive=True):
            if isinstance(d, Waiting):
                yield comment(d.comment())
                continue
            logprobs = None
            if req.logprobs and d.logprobs:
                logprobs = completion_logprobs(tokenizer, d.logprobs, offset)
            offset += len(d.content)
            if d.content or logprobs:
                yield chunk(d.content, logprobs)
    except ApiError as e:
        yield sse(openai_error(e))
        return
    yield chunk("", finish=finish_reason(gen), x_dflash=gen.x_dflash())
    if req.stream_options is not None and req.stream_options.include_usage:
        yield sse({**head, "choices": [], "usage": gen.usage()})
    yield DONE
