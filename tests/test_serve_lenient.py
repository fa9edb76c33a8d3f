"""serve: what agent clients send that a strict reading would refuse is served instead.
A model name of their own gets the one model (`--strict-model-name` keeps the 404), a
max_tokens above the cap or the context left is clamped (with a length finish), system
messages mid-conversation are placed where the template takes them, built-in tools are
left out with a log line, and Anthropic usage splits cached and uncached prompt tokens
as Anthropic's API does."""

import json
import logging

import httpx
import pytest
from serve_helpers import LiveServer, sse_events

from dflash_mlx import load, load_draft
from dflash_mlx.serve import anthropic_routes, prompting, responses_routes
from dflash_mlx.serve.config import ServeConfig
from dflash_mlx.serve.errors import ApiError
from dflash_mlx.serve.schemas import ChatCompletionRequest, MessagesRequest

CAP = 8  # the server's --max-tokens
SYSTEM = "Be brief. " * 60  # long enough for the prompt cache to matter
USER = [{"role": "user", "content": "Count to ten."}]
CHAT = [{"role": "system", "content": SYSTEM}, *USER]
HUGE = 100_000
# one request per endpoint, each naming a model this server does not serve
BODIES = {
    "/v1/chat/completions": {"model": "gpt-5", "messages": CHAT, "max_tokens": HUGE},
    "/v1/completions": {"model": "gpt-5", "prompt": "Count:", "max_tokens": HUGE},
    "/v1/messages": {
        "model": "claude-opus-4-8",
        "max_tokens": 64_000,
        "system": SYSTEM,
        "messages": USER,
    },
    "/v1/responses": {"model": "gpt-5-codex", "instructions": SYSTEM, "input": USER},
}


@pytest.fixture(scope="module")
def pair(tiny_pair):
    t, d = tiny_pair("llama")
    model, tokenizer = load(str(t))
    return model, tokenizer, load_draft(str(d))


@pytest.fixture(scope="module")
def server(pair):
    with LiveServer(*pair, aliases=("tiny-path",), max_tokens=CAP) as s:
        yield s


@pytest.fixture(scope="module")
def strict(pair):
    with LiveServer(*pair, aliases=("tiny-path",), strict_model_name=True) as s:
        yield s


def post(server, path: str, body: dict) -> httpx.Response:
    return httpx.post(server.url + path, json=body, timeout=120)


def generated(path: str, body: dict) -> tuple[int, str]:
    """(tokens generated, finish reason) of a non-streamed answer on `path`."""
    if path == "/v1/messages":
        return body["usage"]["output_tokens"], body["stop_reason"]
    if path == "/v1/responses":
        return body["usage"]["output_tokens"], body["incomplete_details"]["reason"]
    return body["usage"]["completion_tokens"], body["choices"][0]["finish_reason"]


LENGTH = {"max_tokens", "max_output_tokens", "length"}


@pytest.mark.parametrize("path", BODIES)
def test_any_model_name_and_too_many_tokens_are_served(server, path):
    r = post(server, path, BODIES[path])
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["model"] == "tiny"  # the answer names the model that served it
    tokens, finish = generated(path, body)
    assert tokens == CAP and finish in LENGTH


def test_max_completion_tokens_and_stream_options(server):
    body = {
        "model": "gpt-5",
        "messages": CHAT,
        "max_tokens": 5,
        "max_completion_tokens": HUGE,  # wins over max_tokens, then clamped
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    with httpx.stream("POST", server.url + "/v1/chat/completions", json=body) as r:
        chunks = [json.loads(d) for _, d in sse_events(r) if d != "[DONE]"]
    assert chunks[-2]["choices"][0]["finish_reason"] == "length"
    assert chunks[-1]["choices"] == []
    assert chunks[-1]["usage"]["completion_tokens"] == CAP


def test_a_streamed_anthropic_answer_at_the_clamp_ends_with_max_tokens(server):
    body = {**BODIES["/v1/messages"], "stream": True}
    with httpx.stream("POST", server.url + "/v1/messages", json=body) as r:
        events = [json.loads(d) for _, d in sse_events(r)]
    assert events[-2]["delta"]["stop_reason"] == "max_tokens"
    assert events[-2]["usage"]["output_tokens"] == CAP


def test_the_context_left_clamps_max_tokens(server):
    # the tiny llama's context is 4096 tokens: 3 are left after this prompt
    body = {"model": "tiny", "prompt": [65] * 4093, "max_tokens": 5}
    r = post(server, "/v1/completions", body)
    assert r.status_code == 200, r.text
    assert generated("/v1/completions", r.json()) == (3, "length")


def test_strict_model_name_keeps_the_404(strict):
    for path, body in BODIES.items():
        r = post(strict, path, body)
        assert r.status_code == 404, r.text
        error = r.json()["error"]
        assert "/v1/models" in error["message"] and "--strict" in error["message"]
        if path == "/v1/messages":
            assert error["type"] == "not_found_error"
    r = post(strict, "/v1/messages/count_tokens", BODIES["/v1/messages"])
    assert r.status_code == 404
    for name in ("tiny", "tiny-path", None):
        body = {"messages": USER, "max_tokens": 1}
        r = post(strict, "/v1/chat/completions", {**body, "model": name})
        assert r.status_code == 200 and r.json()["model"] == "tiny"


def _stream_usage(server, body: dict) -> tuple[dict, dict]:
    """(message_start's usage, message_delta's usage) of a streamed request."""
    body = {**body, "stream": True}
    with httpx.stream("POST", server.url + "/v1/messages", json=body) as r:
        events = {name: json.loads(d) for name, d in sse_events(r)}
    return events["message_start"]["message"]["usage"], events["message_delta"]["usage"]


def test_anthropic_usage_counts_uncached_and_cached_prompt_tokens(server):
    body = {**BODIES["/v1/messages"], "max_tokens": 4}
    count = post(server, "/v1/messages/count_tokens", body).json()["input_tokens"]
    cached = []
    for _ in range(2):  # the second time the prompt comes from the cache
        start, end = _stream_usage(server, body)
        assert start["output_tokens"] == 0 and end["output_tokens"] == 4
        for usage in (start, end):
            assert usage["input_tokens"] + usage["cache_read_input_tokens"] == count
            assert usage["cache_creation_input_tokens"] == 0
        assert start["input_tokens"] == end["input_tokens"]
        cached.append(end["cache_read_input_tokens"])
    assert cached[1] > 0  # at the latest the second time, it came from the cache
    usage = post(server, "/v1/messages", body).json()["usage"]
    assert usage["input_tokens"] + usage["cache_read_input_tokens"] == count
    assert usage["cache_read_input_tokens"] > 0


def test_system_and_developer_messages_anywhere(server):
    messages = [
        *CHAT,
        {"role": "assistant", "content": "1, 2, 3"},
        {"role": "developer", "content": "Answer in French."},
        {"role": "user", "content": "Go on."},
    ]
    r = post(server, "/v1/chat/completions", {"messages": messages, "max_tokens": 2})
    assert r.status_code == 200, r.text
    body = {
        "max_tokens": 2,
        "messages": [
            *USER,
            {"role": "system", "content": [{"type": "text", "text": "Be terse."}]},
        ],
    }
    assert post(server, "/v1/messages", body).status_code == 200


def test_the_root_answers_clients_that_probe_it(server):
    assert httpx.head(server.url + "/").status_code == 200
    assert httpx.get(server.url + "/").json()["status"] == "ok"


# -- the pieces, without a server -------------------------------------------------
def _template(raise_late=False, drop_late=False):
    """A chat template stand-in: "role: content" lines."""
    calls = []

    def apply(messages):
        calls.append(messages)
        out = []
        for i, m in enumerate(messages):
            if m["role"] == "system" and i > 0:
                if raise_late:
                    raise ValueError("System message must be at the beginning.")
                if drop_late:
                    continue
            out.append(f"{m['role']}: {m['content']}")
        return "\n".join(out)

    return apply, calls


LATE = [
    {"role": "system", "content": "A"},
    {"role": "user", "content": "hi"},
    {"role": "system", "content": "B"},
    {"role": "assistant", "content": "yo"},
    {"role": "system", "content": "C"},
]


def test_late_system_messages_stay_in_place_when_the_template_takes_them():
    apply, calls = _template()
    text = prompting.place_system_messages(LATE, apply)
    assert text == "system: A\nuser: hi\nsystem: B\nassistant: yo\nsystem: C"
    assert len(calls) == 1


@pytest.mark.parametrize("how", ["raise_late", "drop_late"])
def test_late_system_messages_fold_in_order_otherwise(how):
    apply, calls = _template(**{how: True})
    text = prompting.place_system_messages(LATE, apply)
    assert text == "system: A\n\nB\n\nC\nuser: hi\nassistant: yo"
    assert len(calls) == 2
    only_late = LATE[1:]
    text = prompting.place_system_messages(only_late, _template(**{how: True})[0])
    assert text == "system: B\n\nC\nuser: hi\nassistant: yo"


def test_a_leading_system_message_renders_once():
    apply, calls = _template(raise_late=True)
    assert prompting.place_system_messages(CHAT, apply).startswith("system: Be")
    assert len(calls) == 1


def test_tool_results_a_text_model_cannot_read_become_a_note():
    parts = [{"type": "text", "text": "see: "}, {"type": "image", "source": {}}]
    text = prompting.tool_output_text(parts)
    assert text == "see: [image omitted: this model reads text only]"
    assert prompting.tool_output_text(None) == "" == prompting.tool_output_text("")


def test_built_in_tools_are_left_out_with_one_log_line(caplog):
    caplog.set_level(logging.WARNING, logger="dflash_mlx.serve")
    schema = {"type": "object", "properties": {"q": {"type": "string"}}}
    anthropic_tools = MessagesRequest.model_validate(
        {
            "max_tokens": 1,
            "messages": USER,
            "tools": [
                {"name": "lookup", "input_schema": schema},
                {"type": "custom", "name": "lookup2", "input_schema": schema},
                {"type": "web_search_20250305", "name": "web_search", "max_uses": 5},
                {"type": "computer_20250124", "name": "computer"},
            ],
        }
    ).tools
    names = [
        t["function"]["name"] for t in anthropic_routes.function_tools(anthropic_tools)
    ]
    assert names == ["lookup", "lookup2"]
    chat_tools = ChatCompletionRequest.model_validate(
        {
            "messages": USER,
            "tools": [
                {"type": "function", "function": {"name": "f", "parameters": schema}},
                {"type": "web_search"},
                {"type": "file_search", "vector_store_ids": ["v"]},
            ],
        }
    ).tools
    assert [t["function"]["name"] for t in prompting.tool_specs(chat_tools)] == ["f"]
    tools, namespaces = responses_routes.function_tools(
        [
            {"type": "function", "name": "shell", "parameters": schema},
            {
                "type": "namespace",
                "name": "agents",
                "tools": [{"type": "function", "name": "spawn", "parameters": schema}],
            },
            {"type": "namespace", "name": "empty", "tools": []},
            {"type": "web_search", "external_web_access": False},
        ]
    )
    assert [t["function"]["name"] for t in tools] == ["shell", "spawn"]
    assert namespaces == {"spawn": "agents"}
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        "ignoring tools this server cannot run: computer_20250124, web_search_20250305",
        "ignoring tools this server cannot run: file_search, web_search",
        "ignoring tools this server cannot run: empty namespace, web_search",
    ]


def test_served_model():
    config = ServeConfig(model_id="m", aliases=("org/m",))
    assert {config.served_model(n) for n in ("x", None, "m", "org/m")} == {"m"}
    strict = ServeConfig(model_id="m", aliases=("org/m",), strict_model_name=True)
    assert strict.served_model("org/m") == "m"
    with pytest.raises(ApiError) as e:
        strict.served_model("x")
    assert e.value.status == 404 and e.value.code == "model_not_found"
