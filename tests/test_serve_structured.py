"""serve: response formats, tool_choice, penalties and logit_bias on every endpoint,
each answer exactly what stream_generate gives with the same processors (greedy),
alone and batched with others; forced tool calls on a model with JSON tool calls."""

import json
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
import scripted_agent
from mlx_lm.sample_utils import make_logits_processors
from serve_helpers import LiveServer, agent_pair, chat_ids

from dflash_mlx import load, load_draft, stream_generate
from dflash_mlx.engine.loop import as_target
from dflash_mlx.structured import Grammars, GrammarSpec

ASK = [{"role": "user", "content": "Give me an answer."}]
SCHEMA = {
    "type": "object",
    "properties": {
        "answer": {"enum": ["yes", "no", "maybe"]},
        "n": {"type": "integer", "minimum": 0, "maximum": 99},
    },
    "required": ["answer", "n"],
    "additionalProperties": False,
}
JSON_SCHEMA = {"type": "json_schema", "json_schema": {"name": "a", "schema": SCHEMA}}
PENALTIES = dict(
    presence_penalty=0.8,
    frequency_penalty=0.6,
    repetition_penalty=1.4,
    logit_bias={"101": 4.0, "32": -5.0},
)


@pytest.fixture(scope="module")
def pair(tiny_pair):
    t, d = tiny_pair("llama")
    model, tokenizer = load(str(t))
    return model, tokenizer, load_draft(str(d))


@pytest.fixture(scope="module")
def server(pair):
    model, tok, draft = pair
    with LiveServer(model, tok, draft, block_size=4, max_tokens=256) as s:
        yield s


def solo(pair, ids, processors, max_tokens):
    """stream_generate's greedy text for `ids` with `processors`: the reference."""
    model, tok, draft = pair
    responses = list(
        stream_generate(
            model, draft, tok, ids, block_size=4, max_tokens=max_tokens,
            logits_processors=processors,
        )
    )  # fmt: skip
    return "".join(r.text for r in responses), responses[-1].finish_reason


def schema_processor(pair, schema=SCHEMA):
    model, tok, _ = pair
    grammars = Grammars(tok, as_target(model, None).vocab_size)
    return grammars.processor(GrammarSpec.json_schema(schema))


def penalties():
    return make_logits_processors(
        logit_bias={101: 4.0, 32: -5.0},
        repetition_penalty=1.4,
        presence_penalty=0.8,
        frequency_penalty=0.6,
    )


def post(server, path, body):
    r = httpx.post(server.url + path, json={"model": "tiny", **body}, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def test_json_schema_chat_equals_constrained_generate(server, pair):
    """The answer is the grammar-constrained greedy answer, valid, streamed or not."""
    ids = chat_ids(pair[1], ASK, enable_thinking=False)
    expected, finish = solo(pair, ids, [schema_processor(pair)], 60)
    assert finish == "stop"
    value = json.loads(expected)
    assert value["answer"] in ("yes", "no", "maybe") and 0 <= value["n"] <= 99
    body = {"messages": ASK, "max_tokens": 60, "response_format": JSON_SCHEMA}
    choice = post(server, "/v1/chat/completions", body)["choices"][0]
    assert choice["message"]["content"] == expected
    assert choice["finish_reason"] == "stop"
    with httpx.stream(
        "POST",
        server.url + "/v1/chat/completions",
        json={"model": "tiny", **body, "stream": True},
        timeout=120,
    ) as r:
        lines = [x[6:] for x in r.iter_lines() if x.startswith("data: {")]
    chunks = [json.loads(x)["choices"] for x in lines]
    text = "".join(c[0]["delta"].get("content") or "" for c in chunks if c)
    assert text == expected


def test_json_object_completion_and_responses_text_format(server, pair):
    """Completions with json_object and Responses with text.format json_schema."""
    model, tok, _ = pair
    ids = tok.encode("Once upon a time")
    obj = schema_processor(pair, {"type": "object"})
    expected, _ = solo(pair, ids, [obj], 40)
    body = {
        "prompt": "Once upon a time",
        "max_tokens": 40,
        "response_format": {"type": "json_object"},
    }
    choice = post(server, "/v1/completions", body)["choices"][0]
    assert choice["text"] == expected and expected.startswith("{")
    chat = chat_ids(tok, ASK, enable_thinking=False)
    expected, _ = solo(pair, chat, [schema_processor(pair)], 60)
    body = {
        "input": ASK,
        "max_output_tokens": 60,
        "text": {"format": {"type": "json_schema", "name": "a", "schema": SCHEMA}},
    }
    out = post(server, "/v1/responses", body)["output"]
    (message,) = [item for item in out if item["type"] == "message"]
    assert message["content"][0]["text"] == expected
    json.loads(expected)


def test_penalties_and_logit_bias_equal_generate_with_mlx_lm_processors(server, pair):
    """The knobs are mlx-lm's processors, applied as stream_generate applies them."""
    ids = chat_ids(pair[1], ASK)
    expected, _ = solo(pair, ids, penalties(), 50)
    assert expected != solo(pair, ids, None, 50)[0]  # the knobs change the answer
    body = {"messages": ASK, "max_tokens": 50, **PENALTIES}
    choice = post(server, "/v1/chat/completions", body)["choices"][0]
    assert choice["message"]["content"] == expected
    prompt = pair[1].encode("Once upon a time")
    expected, _ = solo(pair, prompt, penalties(), 30)
    body = {"prompt": "Once upon a time", "max_tokens": 30, **PENALTIES}
    assert post(server, "/v1/completions", body)["choices"][0]["text"] == expected


def test_constrained_penalised_and_plain_requests_batched_keep_their_answers(
    server, pair
):
    """Three at once (decoded in one batch): each gets its solo answer."""
    ids = chat_ids(pair[1], ASK)
    bodies = [
        {"messages": ASK, "max_tokens": 60, "response_format": JSON_SCHEMA},
        {"messages": ASK, "max_tokens": 50, **PENALTIES},
        {"messages": ASK, "max_tokens": 50},
    ]
    no_thinking = chat_ids(pair[1], ASK, enable_thinking=False)
    expected = [
        solo(pair, no_thinking, [schema_processor(pair)], 60)[0],
        solo(pair, ids, penalties(), 50)[0],
        solo(pair, ids, None, 50)[0],
    ]
    with ThreadPoolExecutor(3) as pool:
        answers = list(
            pool.map(lambda b: post(server, "/v1/chat/completions", b), bodies)
        )
    got = [a["choices"][0]["message"]["content"] for a in answers]
    assert got == expected


# -- tool_choice on a model whose tool calls are JSON in <tool_call> tags ----------
NAME, CALL = scripted_agent.CALL
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": NAME,
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "get_time",
            "parameters": {
                "type": "object",
                "properties": {"zone": {"enum": ["UTC", "CET"]}},
                "required": ["zone"],
                "additionalProperties": False,
            },
        },
    },
]
WEATHER = [{"role": "user", "content": "Weather in Paris?"}]


@pytest.fixture(scope="module", params=["qwen3", "qwen3_5"])
def agent(models_dir, request):
    """Tool calls as JSON (qwen3) or XML parameters (qwen3_5) in <tool_call> tags."""
    t, d = agent_pair(models_dir, request.param)
    model, tokenizer = load(str(t))
    with LiveServer(model, tokenizer, load_draft(str(d)), max_tokens=64) as s:
        yield s


def test_tool_choice_forces_the_named_tool_on_every_api(agent):
    """The scripted model calls get_weather; forced, it calls get_time with
    arguments valid against get_time's schema; "required" makes it call one of the
    tools sent (its own call is one token of the whole call text, which llguidance's
    mask leaves out for the XML format: it then writes get_time's, valid too)."""
    openai_body = {"messages": WEATHER, "tools": TOOLS, "max_tokens": 64}
    forced = {"type": "function", "function": {"name": "get_time"}}
    for choice in (forced, "required"):
        out = post(
            agent, "/v1/chat/completions", {**openai_body, "tool_choice": choice}
        )
        answer = out["choices"][0]
        assert answer["finish_reason"] == "tool_calls", answer
        (call,) = answer["message"]["tool_calls"]
        name = call["function"]["name"]
        arguments = json.loads(call["function"]["arguments"])
        if choice is forced or name == "get_time":
            assert name == "get_time" and set(arguments) == {"zone"}
            assert arguments["zone"] in ("UTC", "CET")
        else:
            assert (name, arguments) == (NAME, CALL)
    tools = [{"type": "function", **t["function"]} for t in TOOLS]
    body = {"input": WEATHER, "tools": tools, "max_output_tokens": 64}
    out = post(
        agent,
        "/v1/responses",
        {**body, "tool_choice": {"type": "function", "name": "get_time"}},
    )["output"]
    assert [i["name"] for i in out if i["type"] == "function_call"] == ["get_time"]
    anthropic_tools = [
        {"name": t["function"]["name"], "input_schema": t["function"]["parameters"]}
        for t in TOOLS
    ]
    body = {
        "messages": WEATHER,
        "tools": anthropic_tools,
        "max_tokens": 64,
        "tool_choice": {"type": "tool", "name": "get_time"},
    }
    r = httpx.post(
        agent.url + "/v1/messages", json={"model": "tiny", **body}, timeout=120
    )
    assert r.status_code == 200, r.text
    data = r.json()
    assert data["stop_reason"] == "tool_use"
    (use,) = [b for b in data["content"] if b["type"] == "tool_use"]
    assert use["name"] == "get_time" and use["input"]["zone"] in ("UTC", "CET")


def test_max_tokens_is_capped_at_the_context_left(server):
    """A max_tokens past the context (any endpoint: all make their job here) decodes
    only what the context leaves after the prompt."""
    from dflash_mlx.serve.runner import Sampling, make_job

    state = server.state
    ids = [5] * (state.context_length - 10)
    assert make_job(state, ids, Sampling(max_tokens=10**9)).max_tokens == 10
    assert make_job(state, [5], Sampling(max_tokens=10**9)).max_tokens == 256  # cap


def test_tool_choice_none_keeps_the_model_from_calling(agent):
    """The scripted model calls a tool whenever tools are sent; with "none" it
    cannot open a call, on every API."""
    body = {"messages": WEATHER, "tools": TOOLS, "max_tokens": 16}
    answer = post(agent, "/v1/chat/completions", body)["choices"][0]
    assert answer["finish_reason"] == "tool_calls"  # without: a call
    answer = post(agent, "/v1/chat/completions", {**body, "tool_choice": "none"})
    assert answer["choices"][0]["finish_reason"] != "tool_calls"
    assert not answer["choices"][0]["message"].get("tool_calls")
    anthropic_tools = [
        {"name": t["function"]["name"], "input_schema": t["function"]["parameters"]}
        for t in TOOLS
    ]
    r = httpx.post(
        agent.url + "/v1/messages",
        json={
            "model": "tiny",
            "messages": WEATHER,
            "tools": anthropic_tools,
            "max_tokens": 16,
            "tool_choice": {"type": "none"},
        },
        timeout=120,
    )
    assert r.status_code == 200 and r.json()["stop_reason"] != "tool_use", r.text


def test_the_one_at_a_time_lane_applies_them_too(models_dir):
    """Quantized KV caches decode one sequence at a time (engine/loop.py per
    request): a constrained and a penalised answer equal stream_generate's."""
    import tiny

    t = models_dir / "qwen3-kv32-target"
    if not t.exists():
        tiny.make_target(t, "qwen3", head_dim=32)
    d = tiny.make_draft(models_dir / "qwen3-kv32-draft", t)
    model, tok = load(str(t))
    draft = load_draft(str(d))
    pair = (model, tok, draft)
    kv = dict(kv_bits=8, kv_group_size=32)
    with LiveServer(model, tok, draft, block_size=4, max_tokens=64, **kv) as s:
        assert type(s.state.scheduler.engine.decoding).__name__ == "Solo"
        for body, ids, processors in (
            (
                {"response_format": JSON_SCHEMA},
                chat_ids(tok, ASK, enable_thinking=False),
                [schema_processor(pair)],
            ),
            (PENALTIES, chat_ids(tok, ASK), penalties()),
        ):
            responses = stream_generate(
                model, draft, tok, ids, block_size=4, max_tokens=50,
                logits_processors=processors, **kv,
            )  # fmt: skip
            expected = "".join(r.text for r in responses)
            full = {"messages": ASK, "max_tokens": 50, **body}
            answer = post(s, "/v1/chat/completions", full)["choices"][0]
            assert answer["message"]["content"] == expected
