"""OpenAI Responses wire format, stateless: POST /v1/responses (text, reasoning and
function calls; no stored responses; built-in tools are left out)."""

import json
import time
import uuid
from typing import Any

from fastapi import APIRouter, Request

from . import constraints
from .bodies import read_request
from .errors import ApiError
from .prompting import message_text, render_chat, skip_tools, tool_output_text
from .runner import Generation, Sampling, Waiting, start
from .schemas import ResponsesRequest
from .sse import comment, event_stream, sse

router = APIRouter()


def _new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def _item_messages(item: dict, i: int, messages: list[dict]):
    kind = item.get("type", "message")
    where = f"input[{i}]"
    if kind == "message":
        role = item.get("role")
        if role not in ("user", "assistant", "system", "developer"):
            raise ApiError(
                400,
                f"{where}.role must be user, assistant, system or developer.",
                param=f"{where}.role",
            )
        text = message_text(item.get("content"), f"{where}.content")
        messages.append(
            {"role": "system" if role == "developer" else role, "content": text}
        )
    elif kind == "function_call":
        call = {
            "id": item.get("call_id"),
            "type": "function",
            "function": {
                "name": item.get("name"),
                "arguments": json.loads(item.get("arguments") or "{}"),
            },
        }
        last = messages[-1] if messages else None
        if last is None or last["role"] != "assistant" or last.get("content"):
            last = {"role": "assistant", "content": ""}
            messages.append(last)
        last.setdefault("tool_calls", []).append(call)
    elif kind == "function_call_output":
        output = item.get("output")
        messages.append(
            {
                "role": "tool",
                "tool_call_id": item.get("call_id"),
                "content": tool_output_text(output)
                if isinstance(output, list | str | None)
                else json.dumps(output),
            }
        )
    elif kind != "reasoning":
        raise ApiError(
            400,
            f"{where} is a '{kind}' item: send messages, "
            "function_call and function_call_output items.",
            param=where,
        )


def function_tools(tools: list[dict] | None) -> tuple[list[dict] | None, dict]:
    """(function tools for the chat template, function name -> its namespace).

    Function tools, and those inside `namespace` entries (Codex groups its agent tools
    so), reach the model; built-in tools (web_search, file_search, computer use, a
    namespace with no functions...) are left out with a log line."""
    out, namespaces, skipped = [], {}, []
    for tool in tools or []:
        kind = tool.get("type")
        inner = tool.get("tools") if kind == "namespace" else None
        found = [tool] if kind == "function" else inner or []
        found = [t for t in found if t.get("type") == "function" and t.get("name")]
        if not found:
            skipped.append(kind if kind != "namespace" else "empty namespace")
        for t in found:
            keys = ("name", "description", "parameters")
            out.append(
                {"type": "function", "function": {k: t[k] for k in keys if k in t}}
            )
            if inner is not None:
                namespaces[t["name"]] = tool.get("name")
    skip_tools(skipped)
    return out or None, namespaces


def conversation(req: ResponsesRequest) -> list[dict]:
    """The messages for the chat template."""
    if req.previous_response_id:
        raise ApiError(
            400,
            "This server is stateless: send the whole conversation in "
            "'input' instead of previous_response_id.",
            param="previous_response_id",
        )
    messages = (
        [{"role": "system", "content": req.instructions}] if req.instructions else []
    )
    if isinstance(req.input, str):
        messages.append({"role": "user", "content": req.input})
    else:
        for i, item in enumerate(req.input):
            try:
                _item_messages(item, i, messages)
            except (TypeError, AttributeError, json.JSONDecodeError):
                raise ApiError(
                    400,
                    f"input[{i}] is malformed: check its fields.",
                    param=f"input[{i}]",
                ) from None
    return messages


class _Output:
    """The response's output items, built and announced as deltas arrive."""

    def __init__(self, namespaces: dict | None = None):
        self.items: list[dict] = []
        self.open_kind: str | None = None
        self.seq = 0
        self.namespaces = namespaces or {}  # function name -> its namespace

    def event(self, kind: str, **fields) -> str:
        self.seq += 1
        return sse({"type": kind, "sequence_number": self.seq, **fields}, kind)

    def _add(self, item: dict) -> list[str]:
        out = self.close()
        self.items.append(item)
        out.append(
            self.event(
                "response.output_item.added",
                output_index=len(self.items) - 1,
                item=item,
            )
        )
        return out

    def text(self, kind: str, delta: str) -> list[str]:
        out: list[str] = []
        if self.open_kind != kind:
            item: dict[str, Any]
            if kind == "message":
                item = {
                    "type": "message",
                    "id": _new_id("msg"),
                    "status": "in_progress",
                    "role": "assistant",
                    "content": [],
                }
            else:
                item = {
                    "type": "reasoning",
                    "id": _new_id("rs"),
                    "summary": [],
                    "content": [],
                }
            out = self._add(item)
            self.open_kind = kind
            part = (
                {"type": "output_text", "text": "", "annotations": []}
                if kind == "message"
                else {"type": "reasoning_text", "text": ""}
            )
            item["content"].append(part)
            if kind == "message":
                out.append(
                    self.event(
                        "response.content_part.added",
                        **self._where(),
                        content_index=0,
                        part=part,
                    )
                )
        part = self.items[-1]["content"][0]
        part["text"] += delta
        name = (
            "response.output_text.delta"
            if kind == "message"
            else "response.reasoning_text.delta"
        )
        return out + [self.event(name, **self._where(), content_index=0, delta=delta)]

    def function_call(self, call: dict) -> list[str]:
        args = call["arguments"]
        args = args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)
        item = {
            "type": "function_call",
            "id": _new_id("fc"),
            "call_id": call["id"],
            "name": call["name"],
            "arguments": "",
            "status": "in_progress",
        }
        if call["name"] in self.namespaces:
            item["namespace"] = self.namespaces[call["name"]]
        out = self._add(item)
        self.open_kind = "function_call"
        item["arguments"] = args
        out.append(
            self.event(
                "response.function_call_arguments.delta", **self._where(), delta=args
            )
        )
        out.append(
            self.event(
                "response.function_call_arguments.done", **self._where(), arguments=args
            )
        )
        return out + self.close()

    def _where(self) -> dict:
        return {"item_id": self.items[-1]["id"], "output_index": len(self.items) - 1}

    def close(self) -> list[str]:
        if self.open_kind is None:
            return []
        item, kind = self.items[-1], self.open_kind
        self.open_kind = None
        out = []
        if kind in ("message", "reasoning"):
            part = item["content"][0]
            done = (
                "response.output_text.done"
                if kind == "message"
                else "response.reasoning_text.done"
            )
            out.append(
                self.event(done, **self._where(), content_index=0, text=part["text"])
            )
            if kind == "message":
                out.append(
                    self.event(
                        "response.content_part.done",
                        **self._where(),
                        content_index=0,
                        part=part,
                    )
                )
        if "status" in item:
            item["status"] = "completed"
        return out + [
            self.event(
                "response.output_item.done", output_index=len(self.items) - 1, item=item
            )
        ]


def _response(gen: Generation | None, head: dict, items: list[dict]) -> dict:
    body = {**head, "output": items}
    if gen is None:
        return {**body, "status": "in_progress", "usage": None}
    s = gen.stats
    incomplete = gen.finish == "length"
    return {
        **body,
        "status": "incomplete" if incomplete else "completed",
        "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
        "usage": {
            "input_tokens": s.prompt_tokens,
            "input_tokens_details": {"cached_tokens": s.cached_tokens},
            "output_tokens": gen.completion_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": s.prompt_tokens + gen.completion_tokens,
        },
        "x_dflash": gen.x_dflash(),
    }


def _head(req, model: str) -> dict:
    """The response object's fields that do not depend on the answer."""
    return {
        "id": _new_id("resp"),
        "object": "response",
        "created_at": int(time.time()),
        "model": model,
        "error": None,
        "incomplete_details": None,
        "instructions": req.instructions,
        "max_output_tokens": req.max_output_tokens,
        "metadata": {},
        "parallel_tool_calls": True,
        "previous_response_id": None,
        "store": False,
        "temperature": req.temperature,
        "top_p": req.top_p,
        "tool_choice": req.tool_choice or "auto",
        "tools": req.tools or [],
    }


@router.post("/v1/responses")
async def responses(request: Request):
    state = request.app.state.server
    req = await read_request(request, ResponsesRequest)
    model = state.config.served_model(req.model)
    messages = conversation(req)
    tools, namespaces = function_tools(req.tools)
    kwargs = {}
    effort = (req.reasoning or {}).get("effort")
    if effort is not None:
        kwargs["enable_thinking"] = effort not in ("none", "minimal")
    text_format = (req.text or {}).get("format")
    grammar = constraints.response_format(text_format, "text.format")
    forced = constraints.forced_tool(req.tool_choice, "responses")
    if forced is not None:
        grammar = constraints.tool_grammar(state.tokenizer, tools, forced)
    if grammar is not None:  # the grammar holds from the answer's first token
        kwargs["enable_thinking"] = False
    prompt = render_chat(state.tokenizer, messages, tools, kwargs, state.history)
    ids, initial = prompt.ids, prompt.state
    sampling = Sampling(
        max_tokens=req.max_output_tokens,
        temperature=req.temperature,
        top_p=req.top_p,
        processors=constraints.processors(state, None, grammar, req.tool_choice),
    )
    gen = start(
        state,
        ids,
        sampling,
        "responses",
        tools=tools,
        initial_state=initial,
        prompt=prompt,
    )
    head = _head(req, model)
    gen.request_id = head["id"]
    if req.stream:
        return event_stream(_events(gen, head, namespaces))
    output = _Output(namespaces)
    d = await gen.collect(request.is_disconnected)
    if d.reasoning:
        output.text("reasoning", d.reasoning)
    if d.content or not d.tool_calls:
        output.text("message", d.content)
    for call in d.tool_calls:
        output.function_call(call)
    output.close()
    return _response(gen, head, output.items)


async def _events(gen: Generation, head: dict, namespaces: dict):
    output = _Output(namespaces)
    yield output.event("response.created", response=_response(None, head, []))
    yield output.event("response.in_progress", response=_response(None, head, []))
    try:
        async for d in gen.deltas(keepalive=True):
            if isinstance(d, Waiting):
                yield comment(d.comment())
                continue
            events = []
            if d.reasoning:
                events += output.text("reasoning", d.reasoning)
            if d.content:
                events += output.text("message", d.content)
            for call in d.tool_calls:
                events += output.function_call(call)
            for event in events:
                yield event
    except ApiError as e:
        yield output.event("error", code=e.code, message=e.message, param=e.param)
        return
    for event in output.close():
        yield event
    final = _response(gen, head, output.items)
    done = (
        "response.incomplete"
        if final["status"] == "incomplete"
        else "response.completed"
    )
    yield output.event(done, response=final)
