"""`dflash-mlx chat` in a real pseudo-terminal: live view, Ctrl-C, commands, exits,
the line editor (history, paste), Markdown rendering and the engine line."""

import json
import os
import re
import signal
import sys

import pexpect
import pytest
import scripted
from caches import with_native_builds

PROMPT = ">>> "
TIMEOUT = 60
STARTUP = 300  # loading and warming up (native kernels built once per suite run)
UP = "\x1b[A"
PASTE = "\x1b[200~{}\x1b[201~"  # what a terminal sends around a bracketed paste
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
# a scripted target that answers in Markdown: "\n" (the prompt's last token) -> ...
MARKDOWN = [
    "## Shopping\n\n",
    "- **eggs** and milk\n- bread\n\n",
    "```python\nprint('hi')\n```\n\n",
    "All done.",
]


@pytest.fixture(scope="module")
def paths(tiny_pair):
    t, d = tiny_pair("qwen3")
    return str(t), str(d)


@pytest.fixture(scope="module")
def markdown_target(models_dir):
    path = models_dir / "scripted-markdown"
    if not path.exists():
        steps = ["\n", *MARKDOWN, "<|im_end|>"]
        script = dict(zip(steps[:-1], steps[1:], strict=True))
        scripted.make_scripted_target(path, script, MARKDOWN)
    return str(path)


def spawn(*args, cache=None):
    """The chat in a 40x200 terminal, at its first prompt; `cache`: its own user
    cache folder (history, timings)."""
    env = {**os.environ, "TERM": "xterm-256color", "COLUMNS": "200", "LINES": "40"}
    # a pseudo-terminal does not answer the editor's cursor position requests
    env["PROMPT_TOOLKIT_NO_CPR"] = "1"
    if cache is not None:
        env["XDG_CACHE_HOME"] = str(with_native_builds(cache))
    child = pexpect.spawn(
        sys.executable,
        ["-m", "dflash_mlx.cli.main", "chat", *map(str, args)],
        env=env,
        dimensions=(40, 200),
        timeout=TIMEOUT,
        encoding="utf-8",
        codec_errors="replace",
        # A suite started in the background (`cmd &`) ignores SIGINT, and children
        # inherit that: give the chat the terminal's default, as a user's shell does.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    child.expect("Type /help", timeout=STARTUP)
    child.expect_exact(PROMPT)
    return child


def styled(*parts: str) -> str:
    """A regex matching `parts` (regexes) with any styles Rich puts between them."""
    return r"(?:\x1b\[[\d;]*m)*".join(parts)


def answered(child) -> str:
    """The screen output up to the end of the answer (escape codes removed)."""
    child.expect(r"gen \d+ tok @")
    shown = ANSI.sub("", child.before)
    child.expect_exact(PROMPT)
    return shown


def users(path) -> list[str]:
    data = json.loads(path.read_text())
    return [m["content"] for m in data["messages"] if m["role"] == "user"]


def command(child, line, expected):
    child.sendline(line)
    child.expect_exact(expected)
    child.expect_exact(PROMPT)


@pytest.mark.slow
def test_chat_session_in_a_terminal(paths, tmp_path):
    t, d = paths
    child = spawn("-m", t, "-d", d, "-n", 2000)
    # a long answer: the live status line shows, Ctrl-C stops it, the chat goes on
    child.sendline("hello, who are you?")
    child.expect(
        styled(
            "DFlash auto",
            r" · now (?:b\d+ (?:draft|lookup|splice)|plain)",
            r" · \d+/\d+ blocks drafted",
            r" +[\d.]+ tok/s",
            r"  τ \d+\.\d\d \(last \d+\)",
        )
    )
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
    command(child, "/color on", "Token colours on (answers show as raw text")
    child.sendline("coloured now")
    child.expect(r"DFlash b4: \d+/\d+ blocks drafted \(b\d(–b4)?\)")
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


@pytest.mark.slow
def test_history_paste_and_a_second_session(paths, tmp_path):
    t, d = paths
    cache = tmp_path / "cache"
    child = spawn("-m", t, "-d", d, "-n", 8, cache=cache)
    child.send(PASTE.format("line one\nline two") + "\r")  # one message, not two
    answered(child)
    child.sendline("remember this line")
    answered(child)
    child.send(UP)  # the last message comes back, to send again
    child.expect_exact("remember this line")
    child.send("\r")
    answered(child)
    command(child, f"/save {tmp_path / 'one.json'}", "Saved 6 messages")
    child.sendcontrol("d")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0
    assert users(tmp_path / "one.json") == [
        "line one\nline two",
        "remember this line",
        "remember this line",
    ]
    # only what was typed, each message once, in the user cache
    history = cache / "dflash-mlx" / "chat-history.jsonl"
    assert [json.loads(line) for line in history.read_text().splitlines()] == [
        "line one\nline two",
        "remember this line",
        f"/save {tmp_path / 'one.json'}",
    ]

    # Stored block timings where every drafted size costs 1000x its measured time:
    # after trying each size once, the adaptive policy decodes plainly, and says so.
    timings = list((cache / "dflash-mlx" / "timings").glob("*.json"))
    assert timings
    for path in timings:
        data = json.loads(path.read_text())
        data["seconds"] = {
            k: v * (1000 if int(k) > 1 else 1) for k, v in data["seconds"].items()
        }
        path.write_text(json.dumps(data))
    child = spawn("-m", t, "-d", d, "-n", 600, "--no-lookup", cache=cache)
    child.send(UP)  # a second session recalls the first one's messages
    child.expect_exact("/save")
    child.send(UP)
    child.expect_exact("remember this line")
    child.send("\r")
    child.expect(styled("DFlash auto", " · now plain", r" · \d+/\d+ blocks drafted"))
    child.expect(r"DFlash auto: (\d+)/(\d+) blocks drafted \(b\d(–b\d)?\), (\d+) plain")
    drafted, blocks, _, plain = child.match.groups()
    assert int(drafted) + int(plain) == int(blocks) and int(plain) > int(drafted)
    child.expect_exact(PROMPT)
    command(child, f"/save {tmp_path / 'two.json'}", "Saved 2 messages")
    assert users(tmp_path / "two.json") == ["remember this line"]
    child.sendline("/exit")
    child.expect(pexpect.EOF)


def test_markdown_rendering_on_and_off(markdown_target, tmp_path):
    child = spawn("-m", markdown_target, "--no-draft", "--no-thinking", "--plain")
    child.sendline("a list please")
    raw = answered(child)
    for text in ("## Shopping", "- **eggs** and milk", "```python", "All done."):
        assert text in raw
    command(child, "/render on", "Answers rendered as Markdown.")
    child.sendline("again please")
    shown = answered(child)
    for text in ("Shopping", "• eggs and milk", "• bread", "print('hi')", "All done."):
        assert text in shown
    assert "##" not in shown and "**" not in shown and "```" not in shown
    command(child, "/render off", "Answers as raw text.")
    child.sendline("raw again")
    assert "- **eggs** and milk" in answered(child)
    command(child, f"/save {tmp_path / 'chat.json'}", "Saved 6 messages")
    data = json.loads((tmp_path / "chat.json").read_text())
    answers = [m["content"] for m in data["messages"] if m["role"] == "assistant"]
    assert answers == ["".join(MARKDOWN)] * 3  # the transcript keeps the raw text
    child.sendline("/exit")
    child.expect(pexpect.EOF)
