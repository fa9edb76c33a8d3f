"""The server's pages in a real browser: headless Chromium (the system's chromium and
chromium-driver through Selenium; nothing is downloaded) loads the chat and the
dashboard against a server on a scripted tiny target whose answer is Markdown with
markup in it. The chat streams it as Markdown, the markup as text, and prints the
terminal chat's engine line under it; the dashboard's counters move within a second
or so and every number on it equals /metrics or the request's usage and x_dflash; a
protected server shows a key form and no data; the dashboard reconnects after a
restart. Skipped, with the reason, where no Chromium is installed."""

import json
import math
import signal
import socket
import time

import httpx
import pytest
import scripted
import tiny
from serve_helpers import LiveServer, SlowDraft, copy_weights
from ui_screenshots import find_chromium, headless_chromium

from dflash_mlx import load, load_draft
from dflash_mlx.serve.metrics import sample_key

pytest.importorskip(
    "selenium", reason="selenium is not installed (the `test` extra installs it)"
)
pytestmark = pytest.mark.skipif(
    find_chromium() is None,
    reason="no Chromium here: apt-get install chromium chromium-driver "
    "(`make browser`, which `make test` runs, and CI install them where they can)",
)

from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.common.keys import Keys  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

# the scripted target's answer: a phrase a token, Markdown with markup in it
ANSWER = [
    "## Weather\n\n",
    "It is **sunny** <script>window.pwned = 1</script>",
    ' <img src=x onerror="window.pwned = 2">\n\n',
    "```python\nprint('<b>hi</b>')\n```\n\n",
    "All done.",
]
KEY = "browser-key"


@pytest.fixture(scope="module")
def pair(models_dir):
    target, draft = models_dir / "scripted-ui", models_dir / "scripted-ui-draft"
    if not (target / "config.json").exists():
        steps = ["</think>", *ANSWER, "<|im_end|>"]
        script = dict(zip(steps[:-1], steps[1:], strict=True))
        script.update({"<think>": "</think>", "\n": ANSWER[0]})
        scripted.make_scripted_target(target, script, ANSWER)
    if not (draft / "config.json").exists():
        tiny.make_draft(draft, target, num_layers=1)
    model, tok = load(str(target))
    return model, tok, load_draft(str(draft))


@pytest.fixture(scope="module")
def server(pair):
    with LiveServer(*pair, max_tokens=64, draft_id="scripted-draft") as s:
        yield s


@pytest.fixture(scope="module")
def chromium():
    driver = headless_chromium(1280, 900)
    yield driver
    driver.quit()


@pytest.fixture
def browser(chromium):
    yield chromium
    chromium.get("about:blank")  # no page keeps a server's stream open


def wait(driver, until, timeout: float = 20):
    return WebDriverWait(driver, timeout, poll_frequency=0.05).until(until)


def state_is(state: str):
    return lambda d: d.find_element(By.ID, "conn").get_attribute("data-state") == state


def chat(driver, text: str):
    """Send `text` from the chat page; the answer's element once its line is there."""
    before = len(driver.find_elements(By.CSS_SELECTOR, ".msg.assistant .engine"))
    box = driver.find_element(By.ID, "input")
    box.send_keys(text)
    box.send_keys(Keys.ENTER)
    wait(
        driver,
        lambda d: (
            len(d.find_elements(By.CSS_SELECTOR, ".msg.assistant .engine")) > before
        ),
    )
    return driver.find_elements(By.CSS_SELECTOR, ".msg.assistant")[-1]


def terminal_line(data: dict) -> str:
    """The terminal chat's summary line for the same numbers, memory left out."""
    from dflash_mlx.chat.stats import TurnStats
    from dflash_mlx.cli.ui import summary_line

    usage, x = data["usage"], data["x_dflash"]
    sources = {k: v for k, v in x["blocks_by_source"].items() if k != "plain"}
    stats = TurnStats(
        mode="dflash",
        block_size="auto",
        prompt_tokens=usage["prompt_tokens"],
        reused_tokens=usage["prompt_tokens_details"]["cached_tokens"],
        prompt_tps=x["prompt_tps"],
        generation_tokens=usage["completion_tokens"],
        generation_tps=x["decode_tps"],
        ttft=x["ttft_s"],
        blocks=x["verify_steps"],
        accepted=sum(x["tokens_by_source"].values()),
        drafted_blocks=sum(sources.values()),
        sizes={int(k): v for k, v in x["block_sizes"].items()},
        sources=sources,
    )
    return summary_line(stats).plain.replace(" · 0.00 GB", "")


def test_the_chat_streams_markdown_and_shows_markup_as_text(browser, server):
    browser.get(server.url + "/chat")
    wait(browser, state_is("live"))
    answer = chat(browser, "Weather? <script>window.pwned = 3</script><b>bold</b>")
    assert answer.find_element(By.CSS_SELECTOR, "h4").text == "Weather"
    assert answer.find_element(By.CSS_SELECTOR, "strong").text == "sunny"
    code = answer.find_element(By.CSS_SELECTOR, "pre.code code")
    assert (
        code.text == "print('<b>hi</b>')"
        and code.get_attribute("data-lang") == "python"
    )
    body = answer.find_element(By.CSS_SELECTOR, ".body").text
    assert "<script>window.pwned = 1</script>" in body
    assert '<img src=x onerror="window.pwned = 2">' in body
    user = browser.find_element(By.CSS_SELECTOR, ".msg.user").text
    assert "<script>window.pwned = 3</script><b>bold</b>" in user
    injected = (
        "return document.querySelectorAll("
        "'#messages script, #messages img, #messages b').length"
    )
    assert browser.execute_script(injected) == 0
    assert browser.execute_script("return window.pwned") is None
    # under the answer: the terminal chat's engine line for its usage and x_dflash
    line = answer.find_element(By.CSS_SELECTOR, ".engine")
    data = json.loads(line.get_attribute("data-x"))
    assert line.text == terminal_line(data)
    assert "DFlash auto" in line.text and "τ" in line.text
    # sampling settings: max tokens 2 cuts the answer ("hit max tokens")
    browser.find_element(By.CSS_SELECTOR, "#settings summary").click()
    browser.find_element(By.ID, "system").send_keys("Be brief.")
    browser.find_element(By.ID, "max_tokens").send_keys("2")
    short = chat(browser, "Again?")
    assert short.find_element(By.CSS_SELECTOR, ".engine").text.endswith(
        "hit max tokens"
    )
    assert (
        json.loads(
            short.find_element(By.CSS_SELECTOR, ".engine").get_attribute("data-x")
        )["usage"]["completion_tokens"]
        == 2
    )
    browser.find_element(By.ID, "max_tokens").clear()
    browser.find_element(By.ID, "system").clear()
    browser.find_element(By.ID, "new").click()
    assert browser.find_elements(By.CSS_SELECTOR, ".msg") == []
    assert browser.find_element(By.ID, "empty").is_displayed()


def test_stop_ends_the_answer_and_the_request(browser, pair):
    model, tok, draft = pair
    slow = copy_weights(SlowDraft(draft.args, 0.5), draft)  # time to press Stop
    with LiveServer(model, tok, slow, block_size=2, lookup=False) as s:
        browser.get(s.url + "/chat")
        wait(browser, state_is("live"))
        box = browser.find_element(By.ID, "input")
        box.send_keys("Weather?", Keys.ENTER)
        wait(
            browser,
            lambda d: (
                "Weather" in d.find_element(By.CSS_SELECTOR, ".msg.assistant").text
            ),
        )
        browser.find_element(By.ID, "stop").click()
        line = wait(
            browser,
            lambda d: d.find_elements(By.CSS_SELECTOR, ".msg.assistant .engine"),
        )[0]
        assert line.text == "interrupted"
        assert "All done." not in browser.find_element(By.ID, "messages").text
        assert browser.find_element(By.ID, "send").is_displayed()
        deadline = time.monotonic() + 10
        while _metric(s, 'dflash_requests_total{status="cancelled"}') < 1:
            assert time.monotonic() < deadline, "the server did not end the request"
            time.sleep(0.1)
        browser.get("about:blank")


def _scrape(url: str, **headers) -> dict[str, float]:
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(url + "/metrics", headers=headers).text
    return {
        sample_key(s.name, s.labels): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def _sum(scraped: dict, spec: str) -> float:
    """What the page shows for `spec`: the sum of the samples with its labels."""
    name, _, rest = spec.partition("{")
    labels = dict(part.split("=") for part in rest.rstrip("}").split(",") if part)
    labels = {k: v.strip('"') for k, v in labels.items()}
    total = 0.0
    for key, value in scraped.items():
        k_name, _, k_rest = key.partition("{")
        if k_name == name and all(f'{k}="{v}"' in k_rest for k, v in labels.items()):
            total += value
    return total


def _metric(server, spec: str) -> float:
    return _sum(_scrape(server.url), spec)


SHOWN = """return [...document.querySelectorAll('[data-metric]')].map(
  (n) => [n.dataset.metric, n.dataset.per || null, n.dataset.value, n.textContent])"""


def _mismatches(driver, scraped: dict) -> list:
    out = []
    for spec, per, value, text in driver.execute_script(SHOWN):
        want = _sum(scraped, spec)
        if per is not None:
            below = _sum(scraped, per)
            want = want / below if below else None
        got = float(value) if value else None
        if (got is None) != (want is None) or (
            got is not None and not math.isclose(got, want, rel_tol=1e-9)
        ):
            out.append((spec, per, got, want, text))
    return out


def test_the_dashboard_moves_and_shows_what_metrics_and_usage_say(browser, server):
    browser.get(server.url + "/")
    wait(browser, state_is("live"))
    generated = (
        "document.querySelector('[data-metric=\"dflash_generated_tokens_total\"]')"
    )
    before = float(browser.execute_script(f"return {generated}.dataset.value"))
    body = {"messages": [{"role": "user", "content": "Weather?"}], "max_tokens": 32}
    reply = httpx.post(server.url + "/v1/chat/completions", json=body).json()
    done = time.monotonic()
    wait(
        browser,
        lambda d: float(d.execute_script(f"return {generated}.dataset.value")) > before,
        timeout=5,
    )
    # a snapshot within a second of the blocks (tests/test_serve_ui.py), then drawn
    assert time.monotonic() - done < 3.0
    server.wait_idle()
    deadline, wrong = time.monotonic() + 15, None
    while time.monotonic() < deadline:  # idle numbers come at least every 5 s
        wrong = _mismatches(browser, _scrape(server.url))
        if not wrong:
            break
        time.sleep(0.5)
    assert not wrong, wrong
    # the request's row: its usage and x_dflash
    row = browser.find_element(By.CSS_SELECTOR, f'tr[data-request-id="{reply["id"]}"]')
    cells = {
        c.get_attribute("data-field"): (c.get_attribute("data-value"), c.text)
        for c in row.find_elements(By.CSS_SELECTOR, "[data-field]")
    }
    usage, x = reply["usage"], reply["x_dflash"]
    for field in ("prompt_tokens", "completion_tokens"):
        assert int(cells[field][0]) == usage[field]
    assert (
        int(cells["cached_tokens"][0])
        == usage["prompt_tokens_details"]["cached_tokens"]
    )
    for field in ("mean_tau", "ttft_s", "decode_tps"):
        assert float(cells[field][0]) == x[field]
    assert cells["mean_tau"][1] == f"{x['mean_tau']:.2f}"
    assert json.loads(cells["block_sizes"][0]) == x["block_sizes"]
    for source in ("draft", "lookup", "splice", "plain"):
        shown = int(cells[f"tokens_by_source.{source}"][0])
        assert shown == x["tokens_by_source"].get(source, 0)
    banner = browser.find_element(By.ID, "decoding")
    assert banner.is_displayed() and banner.text.startswith(
        ("Decoding plainly", "Speculating")
    )
    kernels = browser.find_element(By.ID, "s-kernels").text
    assert kernels.startswith("target ") and "drafter " in kernels
    assert browser.find_element(By.ID, "s-device").text


def test_a_protected_server_asks_for_its_key_and_shows_nothing_without_it(
    browser, pair
):
    secret = "model-behind-a-key"
    with LiveServer(*pair, model_id=secret, api_key=KEY) as s:
        browser.get(s.url + "/")
        wait(browser, state_is("locked"))
        gate = browser.find_element(By.ID, "key-gate")
        assert gate.is_displayed() and "needs its API key" in gate.text
        assert secret not in browser.page_source
        shown = [v for _, _, v, _ in browser.execute_script(SHOWN)]
        assert not any(shown)
        key = browser.find_element(By.ID, "key-input")
        key.send_keys("wrong", Keys.ENTER)
        wait(
            browser,
            lambda d: "did not accept" in d.find_element(By.ID, "key-gate").text,
        )
        assert secret not in browser.page_source
        browser.find_element(By.ID, "key-input").send_keys(KEY, Keys.ENTER)
        wait(browser, state_is("live"))
        assert browser.find_element(By.ID, "s-model").text == secret
        # the chat, in the same tab: the key is kept for it
        browser.get(s.url + "/chat")
        wait(browser, state_is("live"))
        answer = chat(browser, "Weather?")
        assert "sunny" in answer.text
        browser.execute_script("sessionStorage.clear()")
        browser.get(s.url + "/chat")
        wait(browser, state_is("locked"))
        assert browser.find_element(By.ID, "key-gate").is_displayed()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_the_dashboard_reconnects_after_a_restart(browser, pair):
    port = _free_port()
    first = LiveServer(*pair, port=port, model_id="first").__enter__()
    try:
        browser.get(first.url + "/")
        wait(browser, state_is("live"))
        assert browser.find_element(By.ID, "s-model").text == "first"
        first.server.handle_exit(signal.SIGTERM, None)  # as a SIGTERM would
    finally:
        first.__exit__(None, None, None)
    wait(browser, state_is("down"))
    with LiveServer(*pair, port=port, model_id="second"):
        wait(browser, lambda d: d.find_element(By.ID, "s-model").text == "second")
        wait(browser, state_is("live"))
        browser.get("about:blank")  # its stream ends before the server stops
