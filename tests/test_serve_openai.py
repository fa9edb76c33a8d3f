"""serve, OpenAI API: a real server driven by the official `openai` client.

The byte-level test tokenizer makes every byte one token, so equal text is equal tokens.
"""

from concurrent.futures import ThreadPoolExecutor

import httpx
import mlx.core as mx
import mlx_lm
import numerics
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families
from serve_helpers import (
    FailingOracle,
    LiveServer,
    chat_ids,
    copy_weights,
    reference,
)

from dflash_mlx import load, load_draft

ORACLE_CHAT = [{"role": "user", "content": "hello"}]  # drafts always right: blocks of 4
OTHER_CHAT = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Count to ten."},
]


@pytest.fixture(scope="module")
def pair(tiny_pair):
    t, d = tiny_pair("llama")
    model, tokenizer = load(str(t))
    return model, tokenizer, load_draft(str(d))


@pytest.fixture(scope="module")
def server(pair):
    model, tok, draft = pair
    ids = chat_ids(tok, ORACLE_CHAT)
    tokens, _ = reference(model, draft, tok, ids, 80)
    oracle = copy_weights(FailingOracle(draft.args, ids + tokens, 2000), draft)
    # lookup off: the oracle drafter alone proposes, in blocks of 4
    with LiveServer(
        model, tok, oracle, block_size=4, max_tokens=512, lookup=False
    ) as s:
        yield s


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)


def chat(client, messages, **kw):
    kw.setdefault("max_tokens", 41)
    return client.chat.completions.create(model="tiny", messages=messages, **kw)


def streamed(client, messages, **kw):
    chunks = list(chat(client, messages, stream=True, **kw))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    return text, chunks


@pytest.mark.parametrize("messages", [ORACLE_CHAT, OTHER_CHAT])
def test_greedy_chat_equals_generate_streamed_or_not(server, pair, client, messages):
    model, tok, draft = pair
    ids = chat_ids(tok, messages)
    tokens, text = reference(model, draft, tok, ids, 41)
    r = chat(client, messages)
    assert r.choices[0].message.content == text
    assert r.choices[0].finish_reason == "length"
    assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (len(ids), 41)
    assert r.usage.total_tokens == len(ids) + 41
    text2, chunks = streamed(client, messages, stream_options={"include_usage": True})
    assert text2 == text
    assert chunks[0].choices[0].delta.role == "assistant"
    assert [c.choices[0].finish_reason for c in chunks[-2:-1]] == ["length"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 41
    # the second request found the first one's cache: all but the last prompt token
    assert chunks[-1].usage.prompt_tokens_details.cached_tokens == len(ids) - 1


def test_models_and_health_name_the_pair(server, client):
    assert [m.id for m in client.models.list()] == ["tiny"]
    health = httpx.get(server.url + "/health").json()
    assert health["status"] == "ok" and health["model"] == "tiny"
    assert (health["active"], health["queue_depth"]) == (0, 0)


def test_plain_decoding_without_a_drafter(pair):
    model, tok, _ = pair
    ids = tok.encode("The quick brown fox")
    plain = mlx_lm.stream_generate(model, tok, ids, max_tokens=16)
    expected = "".join(r.text for r in plain)
    with LiveServer(model, tok, None) as s:
        r = httpx.post(
            s.url + "/v1/completions", json={"prompt": ids, "max_tokens": 16}
        )
    assert r.json()["choices"][0]["text"] == expected
    assert r.json()["x_dflash"]["draft"] is None


def test_x_dflash_reports_the_blocks(client):
    x = chat(client, ORACLE_CHAT).x_dflash  # 1 prefill token + 10 blocks of 4
    assert x["verify_steps"] == 10 and x["block_sizes"] == {"4": 10}
    assert x["mean_tau"] == 4.0
    assert x["drafted_tokens"] == x["accepted_tokens"] == 30
    assert x["decode_tps"] > 0 and x["ttft_s"] > 0


def test_completions_take_text_or_token_ids(server, pair, client):
    model, tok, draft = pair
    ids = tok.encode("The quick brown fox")
    tokens, text = reference(model, draft, tok, ids, 20)
    r = client.completions.create(
        model="tiny", prompt="The quick brown fox", max_tokens=20
    )
    assert r.choices[0].text == text and r.usage.completion_tokens == len(tokens)
    chunks = client.completions.create(
        model="tiny", prompt=ids, max_tokens=20, stream=True
    )
    assert "".join(c.choices[0].text for c in chunks) == text


def _block_texts(client, **kw) -> list[str]:
    """Content of each streamed chunk: with no stop strings, one chunk per block."""
    _, chunks = streamed(client, ORACLE_CHAT, **kw)
    return [
        c.choices[0].delta.content for c in chunks[1:] if c.choices[0].delta.content
    ]


def _first_stop(text: str, stops: list[str]) -> int:
    """Where the output ends: at the stop string that is completed first."""
    found = [(text.find(s) + len(s), text.find(s)) for s in stops if s in text]
    return min(found)[1]


def test_stop_strings_cut_exactly_even_across_blocks(client):
    blocks = _block_texts(client)
    full = "".join(blocks)
    k = next(
        i for i in range(1, len(blocks) - 1) if min(map(len, blocks[i : i + 2])) > 1
    )
    across = blocks[k][-2:] + blocks[k + 1][:2]  # starts in one block, ends in the next
    j = next(i for i in range(k + 2, len(blocks)) if len(blocks[i]) >= 3)
    inside = blocks[j][1:3]
    start = len("".join(blocks[:k])) + len(blocks[k]) - 2
    overlapping = [full[start : start + 6], full[start + 1 : start + 3]]
    for stops in ([across], [inside], [inside, across], overlapping):
        cut = _first_stop(full, stops)
        r = chat(client, ORACLE_CHAT, stop=stops)
        assert r.choices[0].message.content == full[:cut]
        assert r.choices[0].finish_reason == "stop"
        text, chunks = streamed(client, ORACLE_CHAT, stop=stops)
        assert text == full[:cut]  # nothing past the stop was ever sent
        assert chunks[-1].choices[0].finish_reason == "stop"
    assert _first_stop(full, overlapping) == start + 1


def test_prompt_cache_reuse_across_turns(server, pair, client):
    model, tok, draft = pair
    first = tok.encode("Once upon a time")
    tokens, _ = reference(model, draft, tok, first, 12)
    client.completions.create(model="tiny", prompt=first, max_tokens=12)
    follow_up = first + tokens + tok.encode(" and then")
    expected, text = reference(model, draft, tok, follow_up, 12)
    r = client.completions.create(model="tiny", prompt=follow_up, max_tokens=12)
    # the cache held the first turn's prompt and answer (all but its last token)
    assert r.usage.prompt_tokens_details.cached_tokens == len(first) + len(tokens) - 1
    assert r.choices[0].text == text


def test_generation_failure_is_a_500_and_the_server_keeps_serving(server, client):
    long = "x" * 2100  # the test drafter raises past 2000 tokens of context
    with pytest.raises(openai.InternalServerError, match="injected drafter failure"):
        chat(client, [{"role": "user", "content": long}])
    with pytest.raises(openai.APIError, match="injected drafter failure"):
        streamed(client, [{"role": "user", "content": long}])
    assert httpx.get(server.url + "/health").json()["status"] == "ok"
    assert chat(client, OTHER_CHAT, max_tokens=4).usage.completion_tokens == 4


def _sampled_requests():
    return [
        dict(messages=OTHER_CHAT, temperature=1.0, seed=7, max_tokens=24),
        dict(messages=ORACLE_CHAT, temperature=0.8, top_p=0.9, seed=3, max_tokens=24),
    ]


def _greedy_requests():
    return [
        dict(messages=ORACLE_CHAT, max_tokens=30),
        dict(messages=OTHER_CHAT, max_tokens=17, frequency_penalty=0.0),
        dict(messages=[{"role": "user", "content": "What is 2+2?"}], max_tokens=25),
        dict(
            messages=[{"role": "user", "content": "abc"}],
            max_tokens=9,
            extra_body={"top_k": 1, "min_p": 0.1},
        ),
        dict(messages=ORACLE_CHAT, max_tokens=33, stop=["!"]),
        dict(messages=[{"role": "user", "content": "Tell me a story."}]),
    ]


def _answer(client, request):
    r = chat(client, **request)
    return r.choices[0].message.content, r.choices[0].finish_reason


def _concurrent_equals_solo(client, requests):
    solo = [_answer(client, req) for req in requests]
    with ThreadPoolExecutor(len(requests)) as pool:
        together = list(pool.map(lambda req: _answer(client, req), requests))
    assert together == solo


def test_concurrent_greedy_clients_get_their_solo_outputs(client):
    requests = _greedy_requests()
    requests += [
        dict(messages=OTHER_CHAT, max_tokens=5),
        dict(messages=ORACLE_CHAT, max_tokens=12, stop=["q", "z"]),
    ]
    _concurrent_equals_solo(client, requests)


def test_concurrent_sampled_clients_get_their_solo_outputs(client):
    _concurrent_equals_solo(client, _greedy_requests()[:6] + _sampled_requests())


def test_same_seed_same_output(client):
    request = _sampled_requests()[0]
    first = _answer(client, request)
    assert _answer(client, request) == first
    assert _answer(client, {**request, "seed": 8}) != first


def test_logprobs_are_the_targets_log_softmax(server, pair, client):
    model, tok, draft = pair
    ids = chat_ids(tok, OTHER_CHAT)
    tokens, _ = reference(model, draft, tok, ids, 12)
    r = chat(client, OTHER_CHAT, max_tokens=12, logprobs=True, top_logprobs=3)
    entries = r.choices[0].logprobs.content
    logits = model(mx.array([ids + tokens[:-1]]))[0, len(ids) - 1 :]
    expected = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    chosen = mx.take_along_axis(expected, mx.array(tokens)[:, None], axis=-1)[:, 0]
    depth = len(model.layers) + 1
    assert len(entries) == len(tokens)
    numerics.assert_close(mx.array([e.logprob for e in entries]), chosen, depth)
    top = mx.sort(expected, axis=-1)[:, ::-1][:, :3]
    got = mx.array([[t.logprob for t in e.top_logprobs] for e in entries])
    numerics.assert_close(got, top, depth, "top_logprobs")
    assert [e.token for e in entries] == [tok.decode([t]) for t in tokens]


def test_metrics_count_requests_tokens_and_acceptance(server, client):
    chat(client, ORACLE_CHAT)
    text = httpx.get(server.url + "/metrics").text
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    assert (
        samples[("dflash_requests_total", (("endpoint", "chat"), ("status", "ok")))]
        >= 1
    )
    assert samples[("dflash_generated_tokens_total", ())] >= 41
    assert samples[("dflash_acceptance_length_bucket", (("le", "4.0"),))] >= 10
    assert (
        samples[("dflash_acceptance_length_bucket", (("le", "3.0"),))]
        < samples[("dflash_acceptance_length_bucket", (("le", "4.0"),))]
    )
    assert samples[("dflash_queue_depth", ())] == 0
    assert samples[("dflash_time_to_first_token_seconds_count", ())] >= 1
    assert samples[("dflash_decode_tokens_per_second_count", ())] >= 1
