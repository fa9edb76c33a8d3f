"""The server's engine under load: requests decoded together and served from the
prefix cache give what each gets alone; a long prompt does not stall the others; the
memory budget holds; a bounded soak of clients that cancel, disconnect and sample."""

import random
import threading
import time

import httpx
import pytest
from serve_helpers import LiveServer, chat_ids, reference

from dflash_mlx import load, load_draft
from dflash_mlx.serve.prompting import render_chat

N = 16


@pytest.fixture(scope="module")
def hybrid(tiny_pair):
    t, d = tiny_pair("qwen3_5")
    model, tok = load(str(t))
    return model, tok, load_draft(str(d))


def _chat(url, messages, max_tokens=N, **extra):
    body = {"messages": messages, "max_tokens": max_tokens, "temperature": 0, **extra}
    r = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def test_a_follow_up_turn_on_a_hybrid_target_is_served_from_the_cache(hybrid):
    """Qwen3.5-style target (GatedDeltaNet layers): turn 2 resends turn 1 and its
    answer as text; its ids are the generated ones (the text of a random byte-level
    model's answer does not even encode back to them), it is served everything the
    caches held, from the snapshot at the end of turn 1, and answers what a cold
    run answers on those ids."""
    model, tok, draft = hybrid
    turn1 = [{"role": "user", "content": "hello world, this is a test"}]
    with LiveServer(model, tok, draft, block_size=4) as s:
        first = _chat(s.url, turn1)
        answer = first["choices"][0]["message"]["content"]
        turn2 = turn1 + [
            {"role": "assistant", "content": answer},
            {"role": "user", "content": "and then?"},
        ]
        # the ids the server gives turn 2: turn 1's, then its answer's as generated
        ids = render_chat(s.state.tokenizer, turn2, history=s.state.history).ids
        second = _chat(s.url, turn2)
        report = httpx.get(f"{s.url}/health").json()["prompt_cache"]
    prompt1 = chat_ids(tok, turn1)
    answer_ids, _ = reference(model, draft, tok, prompt1, N)
    assert ids[: len(prompt1) + N] == prompt1 + answer_ids  # not re-tokenized
    cached = second["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached == len(prompt1) + N - 1  # everything the caches held
    assert report["hits"] >= 1 and report["bytes"] > 0
    _, cold = reference(model, draft, tok, ids, N)
    assert second["choices"][0]["message"]["content"] == cold


def test_a_long_prompt_does_not_stall_a_stream(hybrid):
    """While a long prompt is prefilled in chunks, a streaming answer keeps getting
    blocks between the chunks."""
    model, tok, draft = hybrid
    with LiveServer(model, tok, draft, block_size=2, prefill_chunk=16) as s:
        arrivals, long_started, long_first = [], [], []

        def stream():
            body = {
                "messages": [{"role": "user", "content": "count: 1 2 3"}],
                "max_tokens": 120, "temperature": 0, "stream": True,
            }  # fmt: skip
            with httpx.stream("POST", f"{s.url}/v1/chat/completions", json=body,
                              timeout=120) as r:  # fmt: skip
                for line in r.iter_lines():
                    if line.startswith("data: {"):
                        arrivals.append(time.monotonic())

        streaming = threading.Thread(target=stream)
        streaming.start()
        while len(arrivals) < 3:
            time.sleep(0.01)
        long_started.append(time.monotonic())
        body = {
            "prompt": "a long document. " * 60, "max_tokens": 1, "temperature": 0,
            "stream": True,
        }  # fmt: skip
        with httpx.stream("POST", f"{s.url}/v1/completions", json=body,
                          timeout=120) as r:  # fmt: skip
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    long_first.append(time.monotonic())
                    break
        streaming.join()
    during = [t for t in arrivals if long_started[0] < t < long_first[0]]
    assert len(during) >= 5, (len(during), len(arrivals))


def test_requests_wait_for_memory_within_the_budget(hybrid):
    """With room for one request's caches, a second waits for the first to end."""
    model, tok, draft = hybrid
    with LiveServer(model, tok, draft, block_size=2, max_kv_bytes=1) as s:
        ends, starts = {}, {}

        def ask(name, text):
            starts[name] = time.monotonic()
            _chat(s.url, [{"role": "user", "content": text}], max_tokens=24)
            ends[name] = time.monotonic()

        first = threading.Thread(target=ask, args=("a", "first question"))
        first.start()
        time.sleep(0.3)
        ask("b", "second question")
        first.join()
        assert s.state.scheduler.engine.kv_bytes == 0
    # b could not start decoding before a ended: it finished after a
    assert ends["b"] > ends["a"]


def _solo_answers(model, tok, draft, prompts):
    return [reference(model, draft, tok, tok.encode(p), N)[1] for p in prompts]


@pytest.mark.slow
def test_a_soak_of_clients_that_cancel_disconnect_and_sample(hybrid):
    """16 clients for ~40 s: greedy and sampled requests of mixed lengths, some
    streams dropped midway, some non-streaming clients giving up. No error a request
    did not cause, nothing stuck, every greedy answer equal to its solo answer, and
    the engine idle and its caches released at the end."""
    model, tok, draft = hybrid
    prompts = [f"prompt {i}: " + "word " * (3 + 17 * (i % 4)) for i in range(8)]
    solo = _solo_answers(model, tok, draft, prompts)
    errors, greedy_ok, done = [], [], [0]
    stop_at = time.monotonic() + 40
    with LiveServer(
        model, tok, draft, block_size="auto", max_concurrency=8, max_queue=32,
        prefill_chunk=32,
    ) as s:  # fmt: skip

        def client(seed):
            rng = random.Random(seed)
            while time.monotonic() < stop_at:
                i = rng.randrange(len(prompts))
                kind = rng.choice(["greedy", "greedy", "sampled", "drop", "giveup"])
                body = {"prompt": prompts[i], "max_tokens": N, "temperature": 0}
                if kind == "sampled":
                    body.update(temperature=0.9, seed=rng.randrange(1000))
                try:
                    if kind == "drop":
                        body["stream"] = True
                        with httpx.stream("POST", f"{s.url}/v1/completions",
                                          json=body, timeout=60) as r:  # fmt: skip
                            for n, _ in enumerate(r.iter_lines()):
                                if n == 2:
                                    break  # the client goes away mid-stream
                    elif kind == "giveup":
                        try:
                            httpx.post(f"{s.url}/v1/completions", json=body,
                                       timeout=0.05)  # fmt: skip
                        except httpx.TimeoutException:
                            pass
                    else:
                        r = httpx.post(f"{s.url}/v1/completions", json=body, timeout=60)
                        if r.status_code == 503:
                            time.sleep(0.2)  # the queue is full: retry later
                            continue
                        if r.status_code != 200:
                            errors.append(r.text)
                        elif kind == "greedy":
                            text = r.json()["choices"][0]["text"]
                            greedy_ok.append(text == solo[i] or (i, text, solo[i]))
                except httpx.HTTPError as e:
                    errors.append(repr(e))
                done[0] += 1

        threads = [threading.Thread(target=client, args=(k,)) for k in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        s.wait_idle(30)
        engine = s.state.scheduler.engine
        assert not engine.sequences and engine.kv_bytes == 0
    assert not errors, errors[:3]
    assert greedy_ok and all(ok is True for ok in greedy_ok), [
        g for g in greedy_ok if g is not True
    ][:3]
    assert done[0] > 40
