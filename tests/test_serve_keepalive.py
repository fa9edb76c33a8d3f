"""serve: a long prefill that clients survive.

While a streamed prompt is prefilled the client gets keep-alives (OpenAI and Responses:
SSE comments; Anthropic: `ping` events) after the headers, which go out at once; the
official clients read such streams to the text of a non-streamed answer; /metrics counts
prefilled tokens and seconds; a client that leaves mid-prefill frees its slot, and its
retry resumes from the consistent prefix it left in the prefix cache.

The prefill goes in 32 tokens a chunk here, and a gate holds it before the second
chunk until the test (or, through the SDKs, the first keep-alive to reach the client)
opens it: the keep-alive comes before the first token by construction, not by timing.
"""

import json
import time

import anthropic
import httpx
import httpx2
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families
from serve_helpers import LiveServer, PrefillGate, Tee, chat_ids, reference

from dflash_mlx import load, load_draft
from dflash_mlx.serve import engine as serve_engine
from dflash_mlx.serve import runner

CHUNK = 32
TEXT = {"/v1/completions": '"text": "', "/v1/responses": "output_text.delta"}
MAX_TOKENS = 12


def prompt(topic: str) -> str:
    """A user message of a few hundred tokens (one a byte), its own per test."""
    return f"About {topic}: " + " ".join(f"line {i} of the notes." for i in range(16))


@pytest.fixture(scope="module")
def pair(tiny_pair):
    t, d = tiny_pair("llama")
    model, tokenizer = load(str(t))
    return model, tokenizer, load_draft(str(d))


@pytest.fixture(scope="module")
def server(pair):
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(serve_engine, "PREFILL_STEP", CHUNK)  # alone, a chunk is this
        mp.setattr(runner, "KEEPALIVE_S", 0.05)
        mp.setattr(runner, "KEEPALIVE_IDLE_S", 0.5)
        with LiveServer(*pair, block_size=2) as s:
            s.gate = PrefillGate(s.state.scheduler.engine)
            yield s


@pytest.fixture
def gate(server):
    server.gate.close()
    yield server.gate
    server.gate.open()
    server.wait_idle()


def expected(pair, text: str) -> tuple[list[int], str]:
    """(prompt ids, greedy answer) of `dflash_mlx.generate` for one user message."""
    model, tok, draft = pair
    ids = chat_ids(tok, [{"role": "user", "content": text}])
    return ids, reference(model, draft, tok, ids, MAX_TOKENS)[1]


def metric(server, name: str, **labels) -> float:
    text = httpx.get(server.url + "/metrics").text
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and s.labels == labels:
                return s.value
    return 0.0


def read_to_keepalive(lines, is_keepalive) -> list[str]:
    """Lines of a stream up to and with its first keep-alive."""
    seen = []
    for line in lines:
        seen.append(line)
        if is_keepalive(line):
            return seen
    raise AssertionError(f"the stream ended without a keep-alive: {seen}")


def chat_body(text: str, **kw) -> dict:
    messages = [{"role": "user", "content": text}]
    return {"model": "tiny", "messages": messages, "max_tokens": MAX_TOKENS, **kw}


def first_text_at(lines: list[str]) -> int:
    """Where the first chat chunk with some content is."""
    for i, line in enumerate(lines):
        if line.startswith("data: {"):
            choices = json.loads(line[6:])["choices"]
            if choices and choices[0]["delta"].get("content"):
                return i
    raise AssertionError("no content")


def test_an_openai_stream_sends_headers_then_prefill_comments(server, pair, gate):
    ids, answer = expected(pair, prompt("chat"))
    url = server.url + "/v1/chat/completions"
    body = chat_body(
        prompt("chat"), stream=True, stream_options={"include_usage": True}
    )
    with httpx.stream("POST", url, json=body, timeout=30) as r:
        # the prefill is held at the gate: the status and headers did not wait for it
        assert not gate.opened.is_set()
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        lines = r.iter_lines()
        head = read_to_keepalive(lines, lambda line: line.startswith(": "))
        gate.open()
        rest = list(lines)
    chunks = [
        json.loads(line[6:]) for line in head + rest if line.startswith("data: {")
    ]
    cached = chunks[-1]["usage"]["prompt_tokens_details"]["cached_tokens"]
    # one chunk in (after what the prefix cache gave), held at the gate before the next
    assert head[-1] == f": prefill {cached + CHUNK}/{len(ids)}"
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    lines = head + rest
    first = first_text_at(lines)
    assert len(head) <= first  # the keep-alive came first, and none after the text
    assert not [line for line in lines[first:] if line.startswith(":")]
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks[:-1])
    assert text == answer and "data: [DONE]" in rest


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/responses"])
def test_completions_and_responses_streams_get_comments_too(server, gate, path):
    text = prompt(path)
    if path == "/v1/completions":
        body = {"model": "tiny", "prompt": text, "max_tokens": MAX_TOKENS}
    else:
        body = {"model": "tiny", "input": text, "max_output_tokens": MAX_TOKENS}
    with httpx.stream("POST", server.url + path, json={**body, "stream": True}) as r:
        assert r.status_code == 200 and not gate.opened.is_set()
        lines = r.iter_lines()
        head = read_to_keepalive(lines, lambda line: line.startswith(": prefill "))
        gate.open()
        rest = list(lines)
    lines = head + rest
    first = next(i for i, line in enumerate(lines) if TEXT[path] in line)
    assert len(head) <= first  # the keep-alive came first, none after the first text
    assert not [line for line in lines[first:] if line.startswith(":")]
    done, total = map(int, head[-1].split()[-1].split("/"))
    assert CHUNK <= done < total  # mid-prefill


def test_the_openai_client_reads_a_stream_with_keepalives(server, pair, gate):
    tee = Tee(gate, b"\n: prefill ")
    client = openai.OpenAI(
        base_url=server.url + "/v1",
        api_key="none",
        max_retries=0,
        http_client=tee.client(),
    )
    body = chat_body(prompt("the openai client"))
    chunks = list(client.chat.completions.create(**body, stream=True))
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    lines = tee.raw.decode().splitlines()
    keepalive = next(i for i, line in enumerate(lines) if line.startswith(": prefill"))
    assert 0 < keepalive < first_text_at(lines)
    whole = client.chat.completions.create(**body).choices[0].message.content
    assert streamed == whole == expected(pair, prompt("the openai client"))[1]


def test_an_anthropic_stream_pings_before_message_start(server, pair, gate):
    body = chat_body(prompt("anthropic"), stream=True)
    with httpx.stream("POST", server.url + "/v1/messages", json=body) as r:
        assert r.status_code == 200 and not gate.opened.is_set()
        lines = r.iter_lines()
        head = read_to_keepalive(lines, lambda line: line == "event: ping")
        gate.open()
        rest = list(lines)
    assert head == ["event: ping"]  # before anything else, even message_start
    assert rest[0] == 'data: {"type": "ping"}'
    names = [line[7:] for line in rest if line.startswith("event: ")]
    start = names.index("message_start")
    assert set(names[:start]) <= {"ping"}
    assert names[start + 1] == "ping" and "ping" not in names[start + 2 :]


def test_the_anthropic_client_reads_a_stream_with_pings(server, pair, gate):
    tee = Tee(gate, b"event: ping")
    claude = anthropic.Anthropic(
        base_url=server.url,
        api_key="none",
        max_retries=0,
        http_client=tee.client(httpx2),
    )
    ask = dict(
        model="tiny",
        max_tokens=MAX_TOKENS,
        messages=[{"role": "user", "content": prompt("the anthropic client")}],
    )
    with claude.messages.stream(**ask) as stream:
        streamed = "".join(stream.text_stream)
        final = stream.get_final_message()
    raw = tee.raw.decode()
    assert raw.startswith("event: ping\n")  # the first bytes, the prefill held
    assert final.usage.input_tokens > 0 and final.stop_reason == "max_tokens"
    whole = claude.messages.create(**ask).content[0].text
    assert streamed == whole == expected(pair, prompt("the anthropic client"))[1]


def test_a_request_stuck_behind_another_gets_plain_keepalives(server, pair, gate):
    url = server.url + "/v1/chat/completions"
    with httpx.Client(timeout=30) as http:
        first = chat_body(prompt("the first"), stream=True)
        with http.stream("POST", url, json=first) as held:
            held_lines = held.iter_lines()
            read_to_keepalive(held_lines, lambda line: line.startswith(": prefill"))
            # the engine is held at the gate: the next request has no progress to tell
            second = chat_body(prompt("the second"), stream=True)
            with http.stream("POST", url, json=second) as waiting:
                lines = waiting.iter_lines()
                head = read_to_keepalive(lines, lambda line: line.startswith(": "))
                gate.open()
                rest = list(lines)
            assert "data: [DONE]" in list(held_lines)
    assert head[-1] == ": keep-alive"
    chunks = [json.loads(line[6:]) for line in rest if line.startswith("data: {")]
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks)
    assert text == expected(pair, prompt("the second"))[1]


def test_metrics_count_prefilled_tokens_and_seconds(server):
    tokens = metric(server, "dflash_prefill_tokens_total")
    seconds = metric(server, "dflash_prefill_seconds_total")
    body = chat_body(prompt("metrics"))
    usage = httpx.post(server.url + "/v1/chat/completions", json=body).json()["usage"]
    prefilled = usage["prompt_tokens"] - usage["prompt_tokens_details"]["cached_tokens"]
    assert prefilled > CHUNK
    assert metric(server, "dflash_prefill_tokens_total") - tokens == prefilled
    assert metric(server, "dflash_prefill_seconds_total") > seconds


def cancelled(server) -> float:
    return metric(server, "dflash_requests_total", endpoint="chat", status="cancelled")


def test_a_client_that_leaves_mid_prefill_frees_its_slot(server, pair, gate):
    engine = server.state.scheduler.engine
    before = cancelled(server)
    prefilled, reused = engine.prefill_tokens, engine.store.stats.reused_tokens
    body = chat_body(prompt("leaving"), stream=True)
    with httpx.stream("POST", server.url + "/v1/chat/completions", json=body) as r:
        read_to_keepalive(r.iter_lines(), lambda line: line.startswith(": prefill"))
    deadline = time.monotonic() + 10  # the server sees the connection close
    while cancelled(server) == before:
        assert time.monotonic() < deadline, "the stream was not cancelled"
        time.sleep(0.02)
    gate.open()  # the chunk held at the gate goes in; the job ends before the next
    server.wait_idle()
    assert not engine.sequences and engine.kv_bytes == 0
    assert engine.prefill_tokens - prefilled == 2 * CHUNK
    reused = engine.store.stats.reused_tokens - reused  # its prompt's cached start
    # the prefix cache keeps what it had and the two chunks, no more: a retry resumes
    # there and answers as if it had prefilled everything itself
    ids, answer = expected(pair, prompt("leaving"))
    again = httpx.post(
        server.url + "/v1/chat/completions", json={**body, "stream": False}
    ).json()
    assert again["usage"]["prompt_tokens"] == len(ids) > reused + 2 * CHUNK
    assert (
        again["usage"]["prompt_tokens_details"]["cached_tokens"] == reused + 2 * CHUNK
    )
    assert again["choices"][0]["message"]["content"] == answer
