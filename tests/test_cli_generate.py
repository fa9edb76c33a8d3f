"""`dflash-mlx generate` (and the chat without a terminal) through the real command."""

import json

import pytest
from typer.testing import CliRunner

from dflash_mlx.cli.main import app

runner = CliRunner()


@pytest.fixture(scope="module")
def paths(tiny_pair):
    t, d = tiny_pair("qwen3")
    return str(t), str(d)


def invoke(*args, input=None):
    return runner.invoke(
        app, [str(a) for a in args], input=input, catch_exceptions=False
    )


def test_generate_text_to_stdout_stats_to_stderr(paths):
    t, d = paths
    r = invoke("generate", "--prompt", "Hello", "-m", t, "-d", d, "-n", 10)
    assert r.exit_code == 0, r.output
    assert "tok/s" not in r.stdout and r.stdout.endswith("\n")
    assert "gen 10 tok" in r.stderr and "DFlash auto" in r.stderr and "τ" in r.stderr


def test_generate_json_record_and_lossless_against_plain(paths):
    t, d = paths
    a = json.loads(
        invoke("generate", "-p", "Tell me", "-m", t, "-d", d, "-n", 24, "--json").stdout
    )
    b = json.loads(
        invoke(
            "generate", "-p", "Tell me", "-m", t, "--no-draft", "-n", 24, "--json"
        ).stdout
    )
    assert a["mode"] == "dflash" and a["block_size"] == "auto" and a["draft"] == d
    assert b["mode"] == "plain" and b["draft"] is None and b["block_size"] == 1
    for rec in (a, b):
        assert (
            rec["finish_reason"] in ("stop", "length")
            and 0 < rec["generation_tokens"] <= 24
        )
        assert (
            rec["prompt_tokens"] > 0 and rec["generation_tps"] > 0 and rec["ttft_s"] > 0
        )
    assert a["text"] == b["text"]  # greedy speculative output equals plain decoding
    assert a["generation_tokens"] == b["generation_tokens"]
    assert a["mean_acceptance"] >= 1


def test_generate_reads_stdin_and_block_size(paths):
    t, d = paths
    piped = invoke(
        "generate",
        "-p",
        "-",
        "-m",
        t,
        "-d",
        d,
        "-n",
        8,
        "-b",
        3,
        "--json",
        input="Tell me",
    )
    direct = invoke(
        "generate", "-p", "Tell me", "-m", t, "-d", d, "-n", 8, "-b", 3, "--json"
    )
    a, b = json.loads(piped.stdout), json.loads(direct.stdout)
    assert (
        a["block_size"] == 3
        and a["text"] == b["text"]
        and a["prompt_tokens"] == b["prompt_tokens"]
    )


def test_generate_raw_skips_the_chat_template(paths):
    t, _ = paths
    raw = json.loads(
        invoke("generate", "-p", "Hi", "-m", t, "--raw", "-n", 2, "--json").stdout
    )
    chat = json.loads(invoke("generate", "-p", "Hi", "-m", t, "-n", 2, "--json").stdout)
    assert raw["prompt_tokens"] == 2 and chat["prompt_tokens"] > 10


def test_generate_errors_are_clean(paths):
    t, _ = paths
    r = invoke("generate", "-p", "Hi", "-m", "/no/such/model")
    assert r.exit_code == 1 and "error:" in r.stderr and "Traceback" not in r.output
    r = invoke("generate", "-p", "-", "-m", t, input="   ")
    assert r.exit_code == 2 and "empty" in r.stderr
    r = invoke("generate", "-p", "x" * 5000, "-m", t)
    assert r.exit_code == 1 and "context is 4096" in r.stderr


def test_chat_without_a_terminal_streams_plain_text(paths, tmp_path):
    t, d = paths
    script = (
        "\n".join(
            [
                "Hello",
                "/temp 0.5",
                "/stats",
                "/draft off",
                "Again",
                "/bogus",
                f"/save {tmp_path / 'c.json'}",
                "/exit",
            ]
        )
        + "\n"
    )
    r = invoke("chat", "-m", t, "-d", d, "-n", 6, input=script)
    assert r.exit_code == 0, r.output
    assert "\x1b[" not in r.stdout  # no live widgets, no escape codes
    assert "Temperature 0.5" in r.stdout and "cached tokens" in r.stdout
    assert "Unknown command /bogus" in r.stdout
    assert r.stderr.count("gen 6 tok") == 2  # per-turn summaries go to stderr
    data = json.loads((tmp_path / "c.json").read_text())
    assert [
        m["stats"]["mode"] for m in data["messages"] if m["role"] == "assistant"
    ] == ["dflash", "plain"]


def test_chat_eof_exits_zero_and_no_drafter_note(paths):
    t, _ = paths
    r = invoke("chat", "-m", t, "-n", 4, input="Hi\n")
    assert r.exit_code == 0
    assert "no drafter: plain decoding; pass --draft" in r.stdout
