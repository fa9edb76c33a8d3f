"""Prompt lookup through the commands and the chat session: the --lookup/--no-lookup
flags, lookup without a drafter, and the session's index across turns."""

import json

import pytest
from typer.testing import CliRunner

from dflash_mlx import load, load_draft
from dflash_mlx.chat import ChatSession, Settings
from dflash_mlx.cli.main import app
from dflash_mlx.serve.config import ServeConfig

runner = CliRunner()
# a prompt the tiny target's answer copies from (it repeats itself)
PROMPT = "abc abc abc abc abc"


@pytest.fixture(scope="module")
def paths(tiny_pair):
    t, d = tiny_pair("qwen3")
    return str(t), str(d)


def _generate(*args) -> dict:
    r = runner.invoke(
        app,
        ["generate", "-p", PROMPT, "-n", 40, "--json", *map(str, args)],
        catch_exceptions=False,
    )
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


def test_generate_lookup_flags(paths):
    """On by default with auto, off with --no-lookup, and with --no-draft --lookup the
    copies run without a drafter; the text is plain decoding's every time."""
    t, d = paths
    plain = _generate("-m", t, "--no-draft")
    auto = _generate("-m", t, "-d", d)
    off = _generate("-m", t, "-d", d, "--no-lookup")
    alone = _generate("-m", t, "--no-draft", "--lookup")
    fixed = _generate("-m", t, "-d", d, "-b", 4, "--lookup")
    assert plain["mode"] == "plain" and not plain["sources"]
    assert alone["mode"] == "lookup" and set(alone["sources"]) == {"lookup"}
    assert "lookup" in fixed["sources"] and "lookup" not in off["sources"]
    assert set(auto["sources"]) <= {"draft", "lookup", "splice"}
    for record in (auto, off, alone, fixed):
        assert record["text"] == plain["text"]


def test_the_chat_keeps_one_index_for_the_conversation(paths):
    t, d = paths
    model, tok = load(t)
    session = ChatSession(model, tok, load_draft(d), settings=Settings(max_tokens=16))
    assert session.lookup_on and session.mode == "dflash"
    first = list(session.stream(PROMPT))
    ids = session.render(session.messages[:1])
    answer = [t for c in first for t in c.response.tokens]
    assert session.lookup.tokens == ids + answer
    tables = session.lookup._tables
    list(session.stream("and again: " + PROMPT))
    history = session.lookup.tokens
    assert session.lookup._tables is tables  # the next turn only indexed its tail
    assert history[: len(ids)] == ids and len(history) > len(ids) + len(answer)
    session.command("/reset")
    assert session.lookup.tokens == []


def test_the_chat_without_lookup_leaves_the_index_alone(paths):
    t, d = paths
    model, tok = load(t)
    session = ChatSession(
        model, tok, load_draft(d), settings=Settings(max_tokens=8, lookup=False)
    )
    chunks = list(session.stream(PROMPT))
    assert session.lookup.tokens == []
    assert all(c.response.source in (None, "draft") for c in chunks)


def test_bench_no_lookup_and_serve_default(paths):
    t, d = paths
    r = runner.invoke(
        app,
        ["bench", "-m", t, "--draft", d, "--dataset", "code-edits", "-n", 1,
         "--max-tokens", 12, "--no-lookup"],
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    assert "lookup" not in r.output.split("sources (")[1].split("\n")[0]
    assert ServeConfig(model_id="m").lookup is True
    assert ServeConfig(model_id="m", lookup=False).lookup is False


def test_metrics_count_blocks_and_tokens_per_source():
    """/metrics: verify steps and their tokens by source; the prefill's token is
    none of them."""
    from types import SimpleNamespace as NS

    from dflash_mlx.serve.metrics import Metrics

    store = NS(stats=NS(hits=0, misses=0, reused_tokens=0, evicted=0), nbytes=0)
    store.spill = None
    engine = NS(store=store, snapshot_seconds=0.0, kv_bytes=0, decoding=[])
    engine.prefill_tokens, engine.prefill_seconds = 0, 0.0
    metrics = Metrics(NS(waiting=0, active=0, engine=engine), max_block=8)
    for source, tokens in [(None, [1]), ("lookup", [1, 2, 3]), ("lookup", [4])]:
        metrics.observe_block(NS(first=False, tokens=tokens, source=source))
    metrics.observe_block(NS(first=True, tokens=[9], source=None, elapsed=0.1))
    metrics.observe_block(NS(first=False, tokens=[5, 6], source="splice"))
    text = metrics.render()[0].decode()
    for line in (
        'dflash_blocks_by_source_total{source="lookup"} 2.0',
        'dflash_tokens_by_source_total{source="lookup"} 4.0',
        'dflash_blocks_by_source_total{source="plain"} 1.0',
        'dflash_tokens_by_source_total{source="splice"} 2.0',
    ):
        assert line in text, line
