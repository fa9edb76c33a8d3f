"""serve: the pages' server side, without a browser (tests/test_serve_ui_browser.py
drives them in Chromium): every number of the dashboard's snapshot is a /metrics
sample or a field of the request's usage and x_dflash; the stream sends at most one
snapshot a second and one soon after a block; the pages hold no data, the data needs
the key, and --no-ui serves none of it."""

import json
import math
import threading
import time
from types import SimpleNamespace as NS

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from serve_helpers import BlockClock, LiveServer

from dflash_mlx import load, load_draft
from dflash_mlx.serve import dashboard
from dflash_mlx.serve.metrics import sample_key

KEY = "s3cret-key"
CHAT = {"messages": [{"role": "user", "content": "hello there"}], "max_tokens": 24}
PAGES = ["/chat", *(f"/ui/{name}" for name in dashboard.ASSETS)]


@pytest.fixture(scope="module")
def pair(tiny_pair):
    t, d = tiny_pair("llama")
    model, tok = load(str(t))
    return model, tok, load_draft(str(d))


@pytest.fixture(scope="module")
def server(pair):
    with LiveServer(*pair, max_tokens=64, draft_id="tiny-draft") as s:
        yield s


def metrics(url: str, **headers) -> dict[str, float]:
    """/metrics as {sample as it writes it: value}."""
    text = httpx.get(url + "/metrics", headers=headers).text
    return {
        sample_key(s.name, s.labels): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_the_snapshot_is_metrics_and_each_response_s_own_numbers(server):
    chat = httpx.post(server.url + "/v1/chat/completions", json=CHAT).json()
    body = {"prompt": "The quick brown fox", "max_tokens": 16, "stream": True}
    with httpx.stream("POST", server.url + "/v1/completions", json=body) as r:
        chunks = [json.loads(x[6:]) for x in r.iter_lines() if x[6:].startswith("{")]
    server.wait_idle()
    snap = httpx.get(server.url + "/ui/api/snapshot").json()
    scraped = metrics(server.url)
    for key, value in snap["metrics"].items():
        assert math.isclose(value, scraped[key], rel_tol=1e-12), key
    # every sample /metrics has but the histograms' buckets
    left = {k for k in scraped if "_bucket" not in k and "_created" not in k}
    assert left == set(snap["metrics"])
    assert (
        snap["prompt_cache"] == httpx.get(server.url + "/health").json()["prompt_cache"]
    )
    recent = {r["id"]: r for r in snap["requests"]["recent"]}
    assert snap["requests"]["running"] == []
    for response, usage, x in [
        (chat, chat["usage"], chat["x_dflash"]),
        (chunks[-1], None, chunks[-1]["x_dflash"]),
    ]:
        row = recent[response["id"]]
        assert row["state"] == "ok" and row["finish"] in ("eos", "length")
        assert {k: row[k] for k in x} == x
        if usage is not None:
            assert row["prompt_tokens"] == usage["prompt_tokens"]
            assert row["completion_tokens"] == usage["completion_tokens"]
            details = usage["prompt_tokens_details"]
            assert row["cached_tokens"] == details["cached_tokens"]
    x = chat["x_dflash"]
    assert sum(x["blocks_by_source"].values()) == x["verify_steps"]
    assert sum(x["tokens_by_source"].values()) == round(
        x["mean_tau"] * x["verify_steps"]
    )
    server_info = snap["server"]
    assert server_info["model"] == "tiny" and server_info["mode"] == "dflash"
    assert server_info["kernels"]["target"] and server_info["device"]
    # the plot: the tokens of the verify steps, one count a second
    steps = sum(
        v for k, v in scraped.items() if k.startswith("dflash_tokens_by_source_total")
    )
    assert sum(snap["tokens_per_second"]) == steps
    assert len(snap["tokens_per_second"]) == 300


def test_a_snapshot_comes_within_a_second_of_a_block_and_one_a_second_at_most(
    server,
):
    stop = threading.Event()

    def load():  # requests back to back
        while not stop.is_set():
            httpx.post(server.url + "/v1/chat/completions", json=CHAT, timeout=60)

    built, steps = [], []
    worker = threading.Thread(target=load)
    with BlockClock(server.state.metrics) as clock:
        try:
            with httpx.stream("GET", server.url + "/ui/api/events", timeout=30) as r:
                assert r.headers["content-type"].startswith("text/event-stream")
                worker.start()
                for line in r.iter_lines():
                    if line.startswith("data: "):
                        snap = json.loads(line[6:])
                        built.append(snap["time"])  # when the server made it
                        steps.append(snap["metrics"]["dflash_acceptance_length_count"])
                        if len(built) == 5:
                            break
        finally:
            stop.set()
            worker.join(60)
    gaps = [b - a for a, b in zip(built, built[1:], strict=False)]
    assert min(gaps) >= 0.99, gaps  # at most one a second
    assert steps[-1] > steps[0]
    # every block is in a snapshot made within a second of it (plus a tick's wait)
    for block in clock.times:
        if block < built[-1] - 1.25:
            after = next(t for t in built if t >= block)
            assert after - block <= 1.25, (block, built)


def test_pages_hold_no_data_and_the_data_needs_the_key(pair):
    secret = "secret-model-name-123"
    with LiveServer(*pair, model_id=secret, api_key=KEY) as s:
        page = httpx.get(s.url + "/", headers={"Accept": "text/html"})
        assert page.status_code == 200 and page.headers["content-type"].startswith(
            "text/html"
        )
        assert "script-src 'self'" in page.headers["content-security-policy"]
        assert page.headers["x-content-type-options"] == "nosniff"
        assert httpx.get(s.url + "/").json() == {"status": "ok", "api": "/v1"}
        for path in PAGES:
            r = httpx.get(s.url + path)
            assert r.status_code == 200, path
            assert secret not in r.text and KEY not in r.text
        assert secret not in page.text
        for path in ("/ui/api/snapshot", "/ui/api/events"):
            for headers in ({}, {"Authorization": "Bearer wrong"}):
                r = httpx.get(s.url + path, headers=headers)
                assert r.status_code == 401, path
                assert r.json()["error"]["code"] == "invalid_api_key"
                assert secret not in r.text
        ok = httpx.get(
            s.url + "/ui/api/snapshot", headers={"Authorization": f"Bearer {KEY}"}
        )
        assert ok.status_code == 200 and ok.json()["server"]["model"] == secret
        assert httpx.get(s.url + "/ui/nothing.js").status_code == 401  # not a page


def test_no_ui_serves_no_page(pair):
    with LiveServer(*pair, ui=False) as s:
        r = httpx.get(s.url + "/", headers={"Accept": "text/html"})
        assert r.json() == {"status": "ok", "api": "/v1"}
        for path in (*PAGES, "/ui/api/snapshot", "/ui/api/events"):
            assert httpx.get(s.url + path).status_code == 404, path
        assert httpx.get(s.url + "/health").json()["status"] == "ok"


def test_a_server_without_drafter_or_lookup_says_it_decodes_plainly(pair):
    model, tok, _ = pair
    with LiveServer(model, tok, None, lookup=False) as s:
        httpx.post(s.url + "/v1/chat/completions", json=CHAT)
        decoding = httpx.get(s.url + "/ui/api/snapshot").json()["decoding"]
    assert decoding["plain"] and decoding["proposed_blocks"] == 0
    assert "--no-draft" in decoding["why"] and "--no-lookup" in decoding["why"]


def test_the_policy_s_numbers_say_why_it_decodes_plainly():
    from dflash_mlx.engine.policy import AdaptiveBlockSize
    from dflash_mlx.engine.sources import FixedBlockSize

    policy = AdaptiveBlockSize(4)
    policy.seconds = {1: 0.01, 2: 0.05, 4: 0.08}  # drafting: slower per token
    config = NS(lookup=True)

    def state(policy):
        engine = NS(decoding=NS(policy=policy))
        return NS(config=config, draft=object(), scheduler=NS(engine=engine))

    why = dashboard.plain_reason(state(policy))
    rate = policy.rate(4)
    assert "100.0 tok/s plain" in why and f"{rate:.1f} at block 4" in why
    assert "τ" in why and "again" in why
    assert "--block-size 1" in dashboard.plain_reason(state(FixedBlockSize(1)))
    untimed = dashboard.plain_reason(state(AdaptiveBlockSize(4)))
    assert untimed.startswith("The block-size policy") and "tok/s" not in untimed


def test_the_stream_ends_when_the_server_stops(pair):
    with LiveServer(*pair) as s:
        with httpx.stream("GET", s.url + "/ui/api/events", timeout=30) as r:
            lines = r.iter_lines()
            next(line for line in lines if line.startswith("data: "))
            s.state.scheduler.shutdown()  # what SIGTERM does first
            start = time.monotonic()
            list(lines)  # it ends (the page then reconnects, to the next server)
            assert time.monotonic() - start < 2
