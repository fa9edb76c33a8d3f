"""serve: requests exactly as real agent clients send them (tests/assets/clients:
captured from Claude Code, Codex, Continue, llm and aider against this server, then
trimmed), through a target that thinks, calls a tool and answers once the result is
back (examples/scripted_agent.py), in Qwen3's and Qwen3.5's template styles. Per client:
its tool definitions -> prompt -> streamed tool call -> its own tool result -> answer.
"""

import json
import logging
from pathlib import Path

import httpx
import pytest
import scripted_agent
from scripted_agent import ANSWER, THINK
from serve_helpers import LiveServer, agent_pair, sse_events

from dflash_mlx import load, load_draft

CLIENTS = Path(__file__).parent / "assets" / "clients"
NAME, CALL = scripted_agent.CALL


def captured(name: str) -> dict:
    return json.loads((CLIENTS / f"{name}.json").read_text())


def second_turn(client: str, turn: str = "") -> dict:
    """A second request's body: the first one's, with that turn's messages or input."""
    first, later = captured(client)["body"], captured(turn or f"{client}_turn2")
    return {**first, **{k: v for k, v in later.items() if k != "note"}}


@pytest.fixture(scope="module", params=["qwen3", "qwen3_5"])
def server(request, models_dir):
    t, d = agent_pair(models_dir, request.param)
    model, tokenizer = load(str(t))
    with LiveServer(model, tokenizer, load_draft(str(d)), model_id="agent") as s:
        yield s


def stream(server, path: str, body: dict, headers=None) -> list[dict]:
    """The events of a streamed request, each as its decoded data."""
    url = server.url + path
    with httpx.stream("POST", url, json=body, headers=headers, timeout=300) as r:
        assert r.status_code == 200, r.read()
        return [json.loads(d) for _, d in sse_events(r) if d != "[DONE]"]


def anthropic_answer(events: list[dict]) -> tuple[list[tuple], dict, dict]:
    """([(block type, its text or tool call)], message_start's and message_delta's
    usage) of an Anthropic stream."""
    blocks: list[list] = []
    for e in events:
        if e["type"] == "content_block_start":
            block = e["content_block"]
            blocks.append([block["type"], block.get("name", "")])
        elif e["type"] == "content_block_delta":
            delta = e["delta"]
            text = delta.get("text") or delta.get("thinking") or delta["partial_json"]
            blocks[-1][1] += text
    # pings (keep-alives) may come before message_start while a long prompt prefills
    start = next(e for e in events if e["type"] == "message_start")["message"]
    end = events[-2]
    assert start["model"] == "agent" and end["type"] == "message_delta"
    end["usage"]["stop_reason"] = end["delta"]["stop_reason"]
    return [tuple(b) for b in blocks], start["usage"], end["usage"]


def test_claude_code(server):
    fixture = captured("claude_code")
    body, headers = fixture["body"], fixture["headers"]
    assert body["messages"][1]["role"] == "system"  # placed or folded, never a 400
    assert body["max_tokens"] == 64000 and body["thinking"] == {"type": "adaptive"}
    counted = []
    for request in (body, second_turn("claude_code")):
        path = "/v1/messages/count_tokens"
        counted.append(httpx.post(server.url + path, json=request).json())
        events = stream(server, fixture["path"], request, headers)
        blocks, start, end = anthropic_answer(events)
        # Anthropic's usage: uncached input in both events, cache reads apart
        for usage in (start, end):
            total = usage["input_tokens"] + usage["cache_read_input_tokens"]
            assert total == counted[-1]["input_tokens"]
        assert start["input_tokens"] == end["input_tokens"]
        if request is body:
            call = json.dumps(CALL)
            assert blocks == [("thinking", THINK), ("tool_use", NAME + call)]
            assert end["stop_reason"] == "tool_use"
        else:  # the real client's tool_result, and the answer
            assert blocks == [("thinking", THINK), ("text", ANSWER)]
            assert end["stop_reason"] == "end_turn"
            assert end["cache_read_input_tokens"] > 0  # the first turn's prefix
    assert counted[0]["input_tokens"] > 5000


def test_claude_code_thinking_switch(server):
    body = {**captured("claude_code")["body"], "stream": False, "max_tokens": 16}
    for thinking, first in (
        ({"type": "disabled"}, "tool_use"),
        ({"type": "enabled", "budget_tokens": 1024}, "thinking"),
    ):
        r = httpx.post(server.url + "/v1/messages", json={**body, "thinking": thinking})
        assert r.status_code == 200, r.text
        assert r.json()["content"][0]["type"] == first


def responses_answer(events: list[dict]) -> tuple[list[dict], dict]:
    """(the output items, the final response) of a Responses stream."""
    done = [e["item"] for e in events if e["type"] == "response.output_item.done"]
    assert events[-1]["type"] == "response.completed"
    return done, events[-1]["response"]


def test_codex(server, caplog):
    caplog.set_level(logging.WARNING, logger="dflash_mlx.serve")
    fixture = captured("codex")
    body = fixture["body"]
    kinds = [t["type"] for t in body["tools"]]
    assert "namespace" in kinds and "web_search" in kinds
    assert "max_output_tokens" not in body
    items, final = responses_answer(stream(server, fixture["path"], body))
    assert [i["type"] for i in items] == ["reasoning", "function_call"]
    assert items[1]["name"] == NAME and json.loads(items[1]["arguments"]) == CALL
    assert final["model"] == "agent" and final["tools"] == body["tools"]
    assert "ignoring tools this server cannot run: web_search" in caplog.text
    # after exec_command's output, and after a call of a namespace's function
    for turn in ("codex_turn2", "codex_namespace_turn2"):
        events = stream(server, "/v1/responses", second_turn("codex", turn))
        items, final = responses_answer(events)
        assert [i["type"] for i in items] == ["reasoning", "message"]
        assert items[1]["content"][0]["text"] == ANSWER
        assert final["usage"]["input_tokens_details"]["cached_tokens"] > 0


def chat_answer(events: list[dict]) -> tuple[str, list, str, dict]:
    """(content, tool calls, finish reason, usage) of a chat completions stream."""
    content, calls, finish, usage = "", [], None, {}
    for e in events:
        for choice in e["choices"]:
            content += choice["delta"].get("content") or ""
            calls += choice["delta"].get("tool_calls") or []
            finish = choice["finish_reason"] or finish
        usage = e.get("usage") or usage
    return content, calls, finish, usage


@pytest.mark.parametrize("client", ["continue", "llm"])
def test_openai_agents(server, client):
    fixture = captured(client)
    content, calls, finish, usage = chat_answer(
        stream(server, fixture["path"], fixture["body"])
    )
    assert (content, finish) == ("", "tool_calls")
    assert [(c["index"], c["function"]["name"]) for c in calls] == [(0, NAME)]
    assert json.loads(calls[0]["function"]["arguments"]) == CALL
    assert usage["prompt_tokens"] > 0  # stream_options.include_usage
    body = second_turn(client)
    assert body["messages"][-1]["role"] == "tool"  # the client's tool result
    content, calls, finish, _ = chat_answer(stream(server, fixture["path"], body))
    assert (content, calls, finish) == (ANSWER, [], "stop")


def test_aider(server):
    plain = captured("aider")
    assert "tools" not in plain["body"]  # aider edits through text, not tools
    content, calls, finish, _ = chat_answer(
        stream(server, plain["path"], plain["body"])
    )
    assert (content, finish) == (ANSWER, "stop")
    functions = captured("aider_functions")  # its function schema, forced
    assert functions["body"]["tool_choice"]["function"]["name"] == "write_file"
    r = httpx.post(server.url + functions["path"], json=functions["body"], timeout=300)
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    # enforced: the scripted model's own call (get_weather) is not allowed; the
    # grammar opens write_file's, whose text the script does not know how to close
    if choice["finish_reason"] == "tool_calls":
        (call,) = choice["message"]["tool_calls"]
        assert call["function"]["name"] == "write_file"
    else:
        assert choice["finish_reason"] == "length"
        assert "get_weather" not in json.dumps(choice)
