"""serve: Anthropic Messages (official `anthropic` client) and stateless Responses."""

import json

import anthropic
import httpx
import openai
import pytest
from serve_helpers import LiveServer, chat_ids, reference, sse_events

from dflash_mlx import load, load_draft

SYSTEM = "Be brief."
USER = "Count to ten."
CONVERSATION = [
    {"role": "system", "content": SYSTEM},
    {"role": "user", "content": USER},
]


@pytest.fixture(scope="module")
def pair(tiny_pair):
    t, d = tiny_pair("llama")
    model, tokenizer = load(str(t))
    return model, tokenizer, load_draft(str(d))


@pytest.fixture(scope="module")
def server(pair):
    with LiveServer(*pair) as s:
        yield s


@pytest.fixture(scope="module")
def claude(server):
    return anthropic.Anthropic(base_url=server.url, api_key="none", max_retries=0)


@pytest.fixture(scope="module")
def expected(pair):
    """(prompt ids, tokens, text) of greedy decoding with `dflash_mlx.generate`."""
    model, tok, draft = pair
    ids = chat_ids(tok, CONVERSATION)
    return (ids, *reference(model, draft, tok, ids, 24))


def ask(claude, **kw):
    kw.setdefault("max_tokens", 24)
    return claude.messages.create(
        model="tiny", system=SYSTEM, messages=[{"role": "user", "content": USER}], **kw
    )


def test_messages_equal_generate(claude, expected):
    ids, tokens, text = expected
    m = ask(claude)
    assert [b.type for b in m.content] == ["text"] and m.content[0].text == text
    assert m.stop_reason == "max_tokens" and m.stop_sequence is None
    assert m.usage.output_tokens == len(tokens) == 24
    assert m.usage.input_tokens + m.usage.cache_read_input_tokens == len(ids)
    assert m.x_dflash["verify_steps"] >= 1


def test_streamed_events_come_in_anthropics_order(server, claude, expected):
    body = {
        "model": "tiny",
        "max_tokens": 24,
        "stream": True,
        "system": [{"type": "text", "text": SYSTEM}],  # system as content blocks
        "messages": [{"role": "user", "content": [{"type": "text", "text": USER}]}],
    }
    with httpx.stream("POST", server.url + "/v1/messages", json=body) as r:
        events = sse_events(r)
    names = [name for name, _ in events]
    data = [json.loads(d) for _, d in events]
    assert all(name == d["type"] for name, d in zip(names, data, strict=True))
    deltas = names.count("content_block_delta")
    assert deltas >= 1
    assert names == ["message_start", "ping", "content_block_start"] + [
        "content_block_delta"
    ] * deltas + ["content_block_stop", "message_delta", "message_stop"]
    text = "".join(
        d["delta"]["text"] for d in data if d["type"] == "content_block_delta"
    )
    assert text == expected[2]
    assert data[-2]["delta"]["stop_reason"] == "max_tokens"
    with claude.messages.stream(
        model="tiny",
        max_tokens=24,
        system=SYSTEM,
        messages=[{"role": "user", "content": USER}],
    ) as stream:
        assert "".join(stream.text_stream) == expected[2]
        assert stream.get_final_message().stop_reason == "max_tokens"


def test_stop_sequences(claude, expected):
    text = expected[2]
    stop = text[5:8]
    m = ask(claude, stop_sequences=[stop])
    assert m.content[0].text == text[: text.find(stop)]
    assert (m.stop_reason, m.stop_sequence) == ("stop_sequence", stop)


def test_count_tokens(claude, expected):
    count = claude.messages.count_tokens(
        model="tiny", system=SYSTEM, messages=[{"role": "user", "content": USER}]
    )
    assert count.input_tokens == len(expected[0])


def test_tool_results_render_as_tool_messages(server, pair):
    body = {
        "model": "tiny",
        "max_tokens": 3,
        "messages": [
            {"role": "user", "content": "weather?"},
            {
                "role": "assistant",
                "content": [
                    {
                        "type": "tool_use",
                        "id": "toolu_1",
                        "name": "get",
                        "input": {"a": 1},
                    }
                ],
            },
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": "toolu_1",
                        "content": "sunny",
                    }
                ],
            },
        ],
    }
    r = httpx.post(server.url + "/v1/messages", json=body)
    assert r.status_code == 200 and r.json()["usage"]["output_tokens"] == 3


def test_responses_equal_generate_streamed_or_not(server, expected):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)
    kw = dict(model="tiny", instructions=SYSTEM, input=USER, max_output_tokens=24)
    r = client.responses.create(**kw)
    assert r.output_text == expected[2]
    assert (
        r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    )
    assert r.usage.input_tokens == len(expected[0]) and r.usage.output_tokens == 24
    events = list(client.responses.create(**kw, stream=True))
    kinds = [e.type for e in events]
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert kinds[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.incomplete",
    ]
    assert [e.sequence_number for e in events] == list(range(1, len(events) + 1))
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == expected[2] == events[-1].response.output_text
