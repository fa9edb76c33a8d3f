"""serve: every kind of bad input gets a 4xx in its API's error shape, with a message
that says what to fix, and the server keeps serving. (What agents send that is not
bad input, such as a model name of their own or a max_tokens above the cap, is in
tests/test_serve_lenient.py.)"""

import httpx
import pytest
from serve_helpers import LiveServer

from dflash_mlx import load, load_draft

USER = [{"role": "user", "content": "hi"}]
CHAT = {"model": "tiny", "messages": USER, "max_tokens": 4}
MESSAGES = {"model": "tiny", "messages": USER, "max_tokens": 4}
TOOL = {"type": "function", "function": {"name": "get_time", "parameters": {}}}


def FORCE(name):
    return {"type": "function", "function": {"name": name}}


@pytest.fixture(scope="module")
def server(tiny_pair):
    t, d = tiny_pair("llama")
    model, tokenizer = load(str(t))
    with LiveServer(
        model, tokenizer, load_draft(str(d)), max_tokens=64, max_body_bytes=64 << 10
    ) as s:
        yield s


BAD_CHAT = [
    # (what is wrong, body or raw bytes, status, param, words the message must say)
    ("malformed JSON", b'{"model": "tiny", "messages": [', 400, None, "not valid JSON"),
    ("not an object", b"[1, 2]", 400, None, "JSON object"),
    ("no messages", {"model": "tiny"}, 400, "messages", "required"),
    ("empty messages", {**CHAT, "messages": []}, 400, "messages", "at least 1"),
    (
        "role",
        {**CHAT, "messages": [{"role": "wizard"}]},
        400,
        "messages.0.role",
        "user",
    ),
    (
        "content type",
        {**CHAT, "messages": [{"role": "user", "content": 5}]},
        400,
        "messages.0.content",
        "string",
    ),
    (
        "image part",
        {
            **CHAT,
            "messages": [
                {
                    "role": "user",
                    "content": [{"type": "image_url", "image_url": {"url": "x"}}],
                }
            ],
        },
        400,
        "messages[0].content[0]",
        "text",
    ),
    ("max_tokens type", {**CHAT, "max_tokens": "ten"}, 400, "max_tokens", "integer"),
    ("max_tokens 0", {**CHAT, "max_tokens": 0}, 400, "max_tokens", "greater than"),
    ("max_tokens < 0", {**CHAT, "max_tokens": -3}, 400, "max_tokens", "greater than"),
    ("temperature < 0", {**CHAT, "temperature": -1}, 400, "temperature", "greater"),
    ("temperature > 2", {**CHAT, "temperature": 3}, 400, "temperature", "less"),
    ("temperature type", {**CHAT, "temperature": "hot"}, 400, "temperature", "number"),
    ("top_p > 1", {**CHAT, "top_p": 1.5}, 400, "top_p", "less than or equal to 1"),
    ("top_k < 0", {**CHAT, "top_k": -1}, 400, "top_k", "greater"),
    ("min_p < 0", {**CHAT, "min_p": -0.1}, 400, "min_p", "greater"),
    ("n = 2", {**CHAT, "n": 2}, 400, "n", "less than or equal to 1"),
    ("stream type", {**CHAT, "stream": "yes"}, 400, "stream", "boolean"),
    ("empty stop", {**CHAT, "stop": [""]}, 400, "stop", "empty"),
    (
        "top_logprobs",
        {**CHAT, "logprobs": True, "top_logprobs": 50},
        400,
        "top_logprobs",
        "20",
    ),
    ("penalty range", {**CHAT, "presence_penalty": 5}, 400, "presence_penalty", "[-2"),
    (
        "repetition_penalty 0",
        {**CHAT, "repetition_penalty": 0.0},
        400,
        "repetition_penalty",
        "> 0",
    ),
    (
        "logit_bias outside the vocabulary",
        {**CHAT, "logit_bias": {"999999": 3}},
        400,
        "logit_bias",
        "not a token id",
    ),
    (
        "logit_bias key not an id",
        {**CHAT, "logit_bias": {"hello": 3}},
        400,
        "logit_bias",
        "not a token id",
    ),
    ("logit_bias value", {**CHAT, "logit_bias": {"5": 300}}, 400, "logit_bias", "100"),
    (
        "a schema the grammar library rejects",
        {
            **CHAT,
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "x", "schema": {"type": "no-such-type"}},
            },
        },
        400,
        "response_format",
        "not valid",
    ),
    (
        "json_schema without a schema",
        {**CHAT, "response_format": {"type": "json_schema", "json_schema": {}}},
        400,
        "response_format",
        "needs a 'schema'",
    ),
    (
        "response_format type",
        {**CHAT, "response_format": {"type": "yaml"}},
        400,
        "response_format",
        "not supported",
    ),
    (
        "tool_choice naming a tool not sent",
        {**CHAT, "tools": [TOOL], "tool_choice": FORCE("nope")},
        400,
        "tool_choice",
        "not among the tools sent (get_time)",
    ),
    (
        "tool_choice without tools",
        {**CHAT, "tool_choice": "required"},
        400,
        "tool_choice",
        "no tools were sent",
    ),
    (
        "tool_choice of another shape",
        {**CHAT, "tools": [TOOL], "tool_choice": {"type": "magic"}},
        400,
        "tool_choice",
        "is not one this API takes",
    ),
    (
        "template kwargs",
        {**CHAT, "chat_template_kwargs": {"tokenize": True}},
        400,
        "chat_template_kwargs",
        "server sets",
    ),
    (
        "too long for the context",
        {**CHAT, "messages": [{"role": "user", "content": "x" * 4200}]},
        400,
        "messages",
        "a model with a longer context",
    ),
    (
        "oversized body",
        {**CHAT, "messages": [{"role": "user", "content": "x" * (70 << 10)}]},
        413,
        None,
        "--max-body-bytes",
    ),
]


@pytest.mark.parametrize(
    "what,body,status,param,words", BAD_CHAT, ids=[c[0] for c in BAD_CHAT]
)
def test_bad_chat_requests_get_a_4xx_that_says_what_to_fix(
    server, what, body, status, param, words
):
    kw = {"content": body} if isinstance(body, bytes) else {"json": body}
    r = httpx.post(server.url + "/v1/chat/completions", **kw)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error"
    assert error["param"] == param
    assert words.lower() in error["message"].lower()
    assert httpx.get(server.url + "/health").json()["status"] == "ok"


BAD_OTHER = [
    ("/v1/completions", {"model": "tiny", "prompt": ""}, 400, "empty"),
    ("/v1/completions", {"model": "tiny", "prompt": [1, 9999]}, 400, "token ids"),
    (
        "/v1/completions",
        {"model": "tiny", "prompt": ["a", "b"]},
        400,
        "one per request",
    ),
    ("/v1/completions", {"model": "tiny", "prompt": "a", "echo": True}, 400, "echo"),
    (
        "/v1/responses",
        {"model": "tiny", "input": "a", "previous_response_id": "r"},
        400,
        "stateless",
    ),
    ("/v1/responses", {"model": "tiny", "input": [{"type": "image"}]}, 400, "item"),
    (
        "/v1/responses",
        {
            "model": "tiny",
            "input": "a",
            "tools": [{"type": "function", "name": "get_time", "parameters": {}}],
            "tool_choice": {"type": "function", "name": "nope"},
        },
        400,
        "not among the tools sent",
    ),
    (
        "/v1/responses",
        {
            "model": "tiny",
            "input": "a",
            "text": {"format": {"type": "json_schema", "schema": {"type": 5}}},
        },
        400,
        "not valid",
    ),
    (
        "/v1/completions",
        {"model": "tiny", "prompt": "a", "logit_bias": {"-1": 1}},
        400,
        "not a token id",
    ),
    ("/v1/nothing", {}, 404, "no route"),
]


@pytest.mark.parametrize("path,body,status,words", BAD_OTHER)
def test_bad_requests_on_other_openai_routes(server, path, body, status, words):
    r = httpx.post(server.url + path, json=body)
    assert r.status_code == status, r.text
    assert words in r.json()["error"]["message"].lower()


def test_wrong_method_is_a_405(server):
    r = httpx.get(server.url + "/v1/chat/completions")
    assert r.status_code == 405 and "not allowed" in r.json()["error"]["message"]


BAD_MESSAGES = [
    (
        {k: v for k, v in MESSAGES.items() if k != "max_tokens"},
        400,
        "invalid_request_error",
        "max_tokens",
    ),
    ({**MESSAGES, "temperature": 1.5}, 400, "invalid_request_error", "temperature"),
    (
        {**MESSAGES, "messages": [{"role": "user", "content": [{"type": "image"}]}]},
        400,
        "invalid_request_error",
        "text model",
    ),
    ({**MESSAGES, "stop_sequences": [""]}, 400, "invalid_request_error", "empty"),
    (
        {
            **MESSAGES,
            "tools": [{"name": "get_time", "input_schema": {"type": "object"}}],
            "tool_choice": {"type": "tool", "name": "nope"},
        },
        400,
        "invalid_request_error",
        "not among the tools sent (get_time)",
    ),
]


@pytest.mark.parametrize("body,status,kind,words", BAD_MESSAGES)
def test_bad_anthropic_requests_get_anthropics_error_shape(
    server, body, status, kind, words
):
    r = httpx.post(server.url + "/v1/messages", json=body)
    assert r.status_code == status, r.text
    data = r.json()
    assert data["type"] == "error" and data["error"]["type"] == kind
    assert words in data["error"]["message"]


def test_malformed_json_on_messages_is_anthropic_shaped(server):
    r = httpx.post(server.url + "/v1/messages", content=b"{oops")
    assert r.status_code == 400 and r.json()["type"] == "error"
    assert httpx.get(server.url + "/health").json()["status"] == "ok"
