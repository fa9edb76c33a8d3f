"""serve under pressure: a full queue (503), disconnects, timeouts, API keys.

A drafter that sleeps before each draft keeps requests in flight without using CPU
(prompt lookup off: a copied block skips the drafter, and a tiny random model's
repetitive answer would finish between two requests of a test).
"""

import json

import anthropic
import httpx
import openai
import pytest
from serve_helpers import LiveServer, SlowDraft, copy_weights

from dflash_mlx import load, load_draft

KEY = "sekrit"
AUTH = {"Authorization": f"Bearer {KEY}"}
LONG = {
    "model": "tiny",
    "messages": [{"role": "user", "content": "What is 2+2?"}],  # ~690 tokens to EOS
    "max_tokens": 600,
    "stream": True,
}


@pytest.fixture(scope="module")
def pair(tiny_pair):
    t, d = tiny_pair("llama")
    model, tokenizer = load(str(t))
    draft = load_draft(str(d))
    return model, tokenizer, copy_weights(SlowDraft(draft.args, 0.02), draft)


@pytest.fixture(scope="module")
def busy(pair):
    """One request at a time, one waiting, and an API key."""
    with LiveServer(
        *pair, block_size=2, max_concurrency=1, max_queue=1, api_key=KEY, lookup=False
    ) as s:
        yield s


@pytest.fixture(scope="module")
def impatient(pair):
    with LiveServer(*pair, block_size=2, request_timeout=1.0, lookup=False) as s:
        yield s


def first_content(lines):
    """Read a chat stream up to its first generated text (so it is really running)."""
    for line in lines:
        if line.startswith("data: ") and '"content": "' in line:
            chunk = json.loads(line[6:])
            if chunk["choices"][0]["delta"].get("content"):
                return chunk


def metric(server, name: str, **labels) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(server.url + "/metrics", headers=AUTH).text
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and s.labels == labels:
                return s.value
    return 0.0


def test_a_full_queue_answers_503_with_retry_after(busy):
    with httpx.Client(base_url=busy.url, headers=AUTH, timeout=30) as http:
        with http.stream("POST", "/v1/chat/completions", json=LONG) as running:
            assert first_content(running.iter_lines()) is not None
            with http.stream("POST", "/v1/chat/completions", json=LONG) as waiting:
                assert waiting.status_code == 200
                health = http.get("/health").json()
                assert (health["active"], health["queue_depth"]) == (1, 1)
                r = http.post("/v1/chat/completions", json={**LONG, "stream": False})
                assert r.status_code == 503
                assert int(r.headers["retry-after"]) >= 1
                error = r.json()["error"]
                assert (
                    "retry" in error["message"] and error["code"] == "server_overloaded"
                )
    busy.wait_idle()
    assert metric(busy, "dflash_requests_total", endpoint="chat", status="overloaded")


def test_a_client_that_disconnects_frees_its_slot(busy, pair):
    cancelled = metric(
        busy, "dflash_requests_total", endpoint="chat", status="cancelled"
    )
    generated = metric(busy, "dflash_generated_tokens_total")
    with httpx.Client(base_url=busy.url, headers=AUTH, timeout=30) as http:
        with http.stream("POST", "/v1/chat/completions", json=LONG) as r:
            assert first_content(r.iter_lines()) is not None
        busy.wait_idle()  # cancelled at its next block
        after = metric(
            busy, "dflash_requests_total", endpoint="chat", status="cancelled"
        )
        assert after == cancelled + 1
        assert metric(busy, "dflash_generated_tokens_total") - generated < 100
        # the next request is served normally, from the cache the first one gave back
        r = http.post(
            "/v1/chat/completions", json={**LONG, "stream": False, "max_tokens": 5}
        )
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 5
        assert r.json()["usage"]["prompt_tokens_details"]["cached_tokens"] > 0


def test_a_non_streaming_client_that_gives_up_is_cancelled_too(busy):
    cancelled = metric(
        busy, "dflash_requests_total", endpoint="chat", status="cancelled"
    )
    with pytest.raises(httpx.ReadTimeout):  # httpx closes the connection
        httpx.post(
            busy.url + "/v1/chat/completions",
            json={**LONG, "stream": False},
            headers=AUTH,
            timeout=0.5,
        )
    busy.wait_idle()
    after = metric(busy, "dflash_requests_total", endpoint="chat", status="cancelled")
    assert after == cancelled + 1


def test_requests_past_the_timeout_end_with_504(impatient):
    client = openai.OpenAI(base_url=impatient.url + "/v1", api_key="x", max_retries=0)
    request = {**LONG, "stream": False}
    with pytest.raises(openai.APIStatusError, match="timeout") as err:
        client.chat.completions.create(**request)
    assert err.value.status_code == 504
    with pytest.raises(openai.APIError, match="timeout"):
        list(client.chat.completions.create(**{**request, "stream": True}))
    impatient.wait_idle()
    assert httpx.get(impatient.url + "/health").json()["status"] == "ok"


def test_api_key_is_required_except_for_health(busy):
    body = {**LONG, "stream": False, "max_tokens": 3}
    assert httpx.get(busy.url + "/health").status_code == 200
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"x-api-key": "wrong"}):
        r = httpx.post(busy.url + "/v1/chat/completions", json=body, headers=headers)
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    r = httpx.post(busy.url + "/v1/messages", json={**body, "stream": False})
    assert r.status_code == 401
    assert r.json()["error"]["type"] == "authentication_error"  # Anthropic's shape
    assert httpx.get(busy.url + "/v1/models").status_code == 401
    ok = openai.OpenAI(base_url=busy.url + "/v1", api_key=KEY, max_retries=0)
    assert ok.chat.completions.create(**body).usage.completion_tokens == 3
    claude = anthropic.Anthropic(base_url=busy.url, api_key=KEY, max_retries=0)
    reply = claude.messages.create(
        model="tiny", max_tokens=3, messages=[{"role": "user", "content": "hi"}]
    )
    assert reply.usage.output_tokens == 3
