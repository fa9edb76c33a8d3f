"""`dflash-mlx chat` in a real pseudo-terminal: live view, Ctrl-C, commands, exits."""

import json
import os
import signal
import sys

import pexpect
import pytest

PROMPT = ">>> "
TIMEOUT = 60


@pytest.fixture(scope="module")
def paths(tiny_pair):
    t, d = tiny_pair("qwen3")
    return str(t), str(d)


def spawn(*args):
    env = {**os.environ, "TERM": "xterm-256color", "COLUMNS": "140", "LINES": "40"}
    child = pexpect.spawn(
        sys.executable,
        ["-m", "dflash_mlx.cli.main", "chat", *map(str, args)],
        env=env,
        dimensions=(40, 140),
        timeout=TIMEOUT,
        encoding="utf-8",
        codec_errors="replace",
        # A suite started in the background (`cmd &`) ignores SIGINT, and children
        # inherit that: give the chat the terminal's default, as a user's shell does.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    child.expect("Type /help")
    child.expect_exact(PROMPT)
    return child


def command(child, line, expected):
    child.sendline(line)
    child.expect_exact(expected)
    child.expect_exact(PROMPT)


def test_chat_session_in_a_terminal(paths, tmp_path):
    t, d = paths
    child = spawn("-m", t, "-d", d, "-n", 2000)
    # a long answer: the live status line shows, Ctrl-C stops it, the chat goes on
    child.sendline("hello, who are you?")
    child.expect(r"DFlash auto.*tok/s.*τ \d+\.\d\d \(last \d+\)")
    child.sendcontrol("c")
    child.expect_exact("interrupted: the partial answer stays in the conversation")
    child.expect_exact(PROMPT)

    command(child, "/max 16", "Max tokens 16.")
    # second turn: the first turn's prompt and the partial answer come from the cache
    child.sendline("second turn please")
    child.expect(r"prompt (\d+) tok, (\d+) cached")
    prompt_tokens, cached = map(int, child.match.groups())
    assert 30 < cached < prompt_tokens
    child.expect_exact(PROMPT)

    command(child, "/help", "/draft on|off")
    command(child, "/stats", "cached tokens")
    command(child, "/temp 0.5", "Temperature 0.5.")
    command(child, "/temp 0", "Temperature 0 (greedy).")
    command(child, "/block 4", "Block size 4.")
    command(child, "/draft off", "Plain decoding")
    child.sendline("plain please")
    child.expect(r"gen \d+ tok @ [\d.]+ tok/s")
    child.expect_exact(" · plain")
    child.expect_exact(PROMPT)
    command(child, "/draft on", "Speculative decoding on.")
    command(child, "/color on", "Token colours on.")
    child.sendline("coloured now")
    child.expect_exact("DFlash b4")
    child.expect_exact(PROMPT)

    # multi-line input, both ways
    for line in ['"""', "line one", "line two", '"""']:
        child.sendline(line)
    child.expect(r"gen \d+ tok")
    child.expect_exact(PROMPT)
    child.sendline("first half \\")
    child.sendline("second half")
    child.expect(r"gen \d+ tok")
    child.expect_exact(PROMPT)

    command(child, f"/save {tmp_path / 'chat.json'}", "Saved 12 messages")
    command(child, f"/save {tmp_path / 'chat.md'}", "Saved")
    command(child, "/bogus", "Unknown command /bogus")
    command(child, "/temp hot", "Expected a number")
    command(child, "/reset", "Conversation and caches cleared.")
    child.sendline("/exit")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0

    data = json.loads((tmp_path / "chat.json").read_text())
    users = [m["content"] for m in data["messages"] if m["role"] == "user"]
    assert users[-2:] == ["line one\nline two", "first half \nsecond half"]
    answers = [m for m in data["messages"] if m["role"] == "assistant"]
    assert answers[0]["interrupted"] is True and answers[0]["content"]
    assert [a["stats"]["mode"] for a in answers] == [
        "dflash",
        "dflash",
        "plain",
        "dflash",
        "dflash",
        "dflash",
    ]
    assert "*[interrupted]*" in (tmp_path / "chat.md").read_text()


def test_ctrl_c_at_the_prompt_cancels_the_line_and_ctrl_d_leaves(paths):
    t, _ = paths
    child = spawn("-m", t, "-n", 4)
    child.send("half a thought")
    child.sendcontrol("c")  # as in Python's REPL: the line goes, the chat stays
    child.expect_exact("line cancelled: Ctrl-D or /exit leaves")
    child.expect_exact(PROMPT)
    command(child, "/temp 0", "Temperature 0 (greedy).")
    child.sendcontrol("d")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0 and child.signalstatus is None


def test_a_non_utf8_message_is_refused_and_the_chat_goes_on(paths):
    t, _ = paths
    child = spawn("-m", t, "-n", 4)
    os.write(child.child_fd, b"caf\xe9 au lait\r")  # Latin-1, not UTF-8
    child.expect_exact("not valid UTF-8")
    child.expect_exact(PROMPT)
    command(child, "/temp 0", "Temperature 0 (greedy).")
    child.sendline("/exit")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0
