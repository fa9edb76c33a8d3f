"""serve: tool calls and reasoning, parsed by mlx-lm's own tool parsers and thinking
markers, from a scripted target (examples/scripted_agent.py) through the real engine, in
both template styles: Qwen3's (`<tool_call>` JSON) and Qwen3.5's (`<function=...>` XML,
`<think>` opened by the prompt). Each API round-trips: tools -> streamed call -> the
tool's result -> the answer."""

import json

import anthropic
import httpx
import openai
import pytest
import scripted_agent
from scripted_agent import ANSWER, THINK
from serve_helpers import LiveServer, agent_pair, sse_events

from dflash_mlx import load, load_draft

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather in a city.",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
            },
        },
    }
]
ASK = [{"role": "user", "content": "Weather in Paris?"}]
NO_THINKING = {"chat_template_kwargs": {"enable_thinking": False}}
NAME, CALL = scripted_agent.CALL


@pytest.fixture(scope="module", params=["qwen3", "qwen3_5"])
def server(request, models_dir):
    t, d = agent_pair(models_dir, request.param)
    model, tokenizer = load(str(t))
    assert tokenizer.has_tool_calling and tokenizer.has_thinking
    with LiveServer(model, tokenizer, load_draft(str(d))) as s:
        yield s


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)


def test_a_tool_call_and_its_result_round_trip(client):
    r = client.chat.completions.create(
        model="tiny", messages=ASK, tools=TOOLS, extra_body=NO_THINKING
    )
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.function.name == NAME
    assert json.loads(call.function.arguments) == CALL
    # the answer feeds back: the assistant's call and the tool's result
    follow_up = ASK + [
        choice.message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "sunny"},
    ]
    again = client.chat.completions.create(
        model="tiny", messages=follow_up, tools=TOOLS, extra_body=NO_THINKING
    )
    assert again.choices[0].finish_reason == "stop"
    assert again.choices[0].message.content == ANSWER


def test_streamed_tool_calls_never_leak_markup(client):
    chunks = list(
        client.chat.completions.create(
            model="tiny", messages=ASK, tools=TOOLS, stream=True, extra_body=NO_THINKING
        )
    )
    content = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert "<tool_call>" not in content and NAME not in content
    calls = [t for c in chunks for t in c.choices[0].delta.tool_calls or []]
    assert [(t.index, t.function.name) for t in calls] == [(0, NAME)]
    assert json.loads(calls[0].function.arguments) == CALL
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_thinking_goes_to_reasoning_content(client):
    r = client.chat.completions.create(model="tiny", messages=ASK)  # default: on
    message = r.choices[0].message
    assert message.reasoning_content == THINK
    assert message.content == ANSWER
    assert r.choices[0].finish_reason == "stop"
    chunks = list(
        client.chat.completions.create(model="tiny", messages=ASK, stream=True)
    )
    deltas = [c.choices[0].delta for c in chunks]
    reasoning = "".join(getattr(d, "reasoning_content", None) or "" for d in deltas)
    assert reasoning == THINK
    assert "".join(d.content or "" for d in deltas) == ANSWER
    # reasoning_effort is the thinking switch too
    r = client.chat.completions.create(
        model="tiny", messages=ASK, reasoning_effort="none"
    )
    assert getattr(r.choices[0].message, "reasoning_content", None) is None
    assert r.choices[0].message.content == ANSWER


def test_thinking_then_a_tool_call(client):
    r = client.chat.completions.create(model="tiny", messages=ASK, tools=TOOLS)
    message = r.choices[0].message
    assert message.reasoning_content == THINK and message.content is None
    assert [c.function.name for c in message.tool_calls] == [NAME]


def test_anthropic_tool_use_thinking_and_the_result(server):
    claude = anthropic.Anthropic(base_url=server.url, api_key="none", max_retries=0)
    tools = [{"name": NAME, "input_schema": TOOLS[0]["function"]["parameters"]}]
    kw = dict(model="tiny", max_tokens=32, messages=ASK, tools=tools)
    m = claude.messages.create(**kw, thinking={"type": "disabled"})
    assert m.stop_reason == "tool_use"
    (use,) = m.content
    assert (use.type, use.name, use.input) == ("tool_use", NAME, CALL)
    for thinking in ({"type": "enabled", "budget_tokens": 64}, {"type": "adaptive"}):
        m = claude.messages.create(**kw, thinking=thinking)
        assert [b.type for b in m.content] == ["thinking", "tool_use"]
        assert m.content[0].thinking == THINK
    result = {"type": "tool_result", "tool_use_id": use.id, "content": "sunny"}
    turns = ASK + [
        {"role": "assistant", "content": [b.model_dump() for b in m.content]},
        {"role": "user", "content": [result]},
    ]
    with claude.messages.stream(**{**kw, "messages": turns}) as stream:
        final = stream.get_final_message()
    assert [b.type for b in final.content] == ["thinking", "text"]
    assert (final.content[1].text, final.stop_reason) == (ANSWER, "end_turn")
    body = {**kw, "stream": True, "thinking": {"type": "disabled"}}
    with httpx.stream("POST", server.url + "/v1/messages", json=body) as r:
        events = [json.loads(d) for _, d in sse_events(r)]
    start = next(e for e in events if e["type"] == "content_block_start")
    assert start["content_block"]["type"] == "tool_use"
    partial = "".join(
        e["delta"]["partial_json"] for e in events if e["type"] == "content_block_delta"
    )
    assert json.loads(partial) == CALL
    assert events[-2]["delta"]["stop_reason"] == "tool_use"


def test_responses_function_calls_reasoning_and_the_result(client):
    tools = [{"type": "function", **TOOLS[0]["function"]}]
    r = client.responses.create(
        model="tiny", input=ASK, tools=tools, reasoning={"effort": "none"}
    )
    (call,) = r.output
    assert call.type == "function_call" and json.loads(call.arguments) == CALL
    r = client.responses.create(
        model="tiny", input="Weather?", reasoning={"effort": "low"}
    )
    assert [o.type for o in r.output] == ["reasoning", "message"]
    assert r.output_text == ANSWER
    events = list(
        client.responses.create(
            model="tiny",
            input=ASK,
            tools=tools,
            reasoning={"effort": "none"},
            stream=True,
        )
    )
    done = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert len(done) == 1 and json.loads(done[0].arguments) == CALL
    assert events[-1].type == "response.completed"
    output = {"type": "function_call_output", "call_id": call.call_id, "output": "sun"}
    r = client.responses.create(
        model="tiny",
        input=[*ASK, call.model_dump(exclude_none=True), output],
        tools=tools,
        reasoning={"effort": "none"},
    )
    assert r.output_text == ANSWER and r.status == "completed"


@pytest.mark.parametrize("style", ["qwen3", "qwen3_5"])
def test_a_second_call_once_the_result_is_back(tmp_path, style):
    """The clients check's target for agents that end a task with a tool call
    (mini-swe-agent's submit command): the first call, its result, then the second
    call, where the one-call target answers."""
    from mlx_lm.tool_parsers import json_tools, qwen3_coder

    from dflash_mlx import generate

    then = ("get_weather", {"city": "Rome"})
    path = scripted_agent.make_scripted_target(tmp_path / "t", style, then=then)
    model, tok = load(str(path))
    parse = (json_tools if style == "qwen3" else qwen3_coder).parse_tool_call

    def reply(messages):
        ids = tok.apply_chat_template(messages, tools=TOOLS, add_generation_prompt=True)
        text = generate(model, None, tok, ids, max_tokens=40)
        assert text.count("<tool_call>") == 1, text
        return text.split("<tool_call>")[1].split("</tool_call>")[0]

    first = parse(reply(ASK), TOOLS)
    assert (first["name"], first["arguments"]) == (NAME, CALL)
    call = {"type": "function", "function": {"name": NAME, "arguments": CALL}}
    done = ASK + [
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "content": "sunny"},
    ]
    second = parse(reply(done), TOOLS)
    assert (second["name"], second["arguments"]) == then
