"""`dflash-mlx launch`: fake client executables on PATH record what reaches them; a
server started for the client stops when it exits, one reused keeps running."""

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import tiny
from typer.testing import CliRunner

from dflash_mlx.cli.main import app
from dflash_mlx.serve.agents import AGENTS, Endpoint, find_agent, needs_context
from dflash_mlx.serve.launch import health

FAKE = """#!{python}
import json, os, re, sys, urllib.request
seen = " ".join([*sys.argv, *os.environ.values()])
urls = sorted(set(re.findall(r"http://127\\.0\\.0\\.1:[0-9]+", seen)))
health = [json.load(urllib.request.urlopen(u + "/health", timeout=10)) for u in urls]
record = {{"argv": sys.argv[1:], "env": dict(os.environ), "health": health}}
with open(os.environ["FAKE_RECORD"] + ".part", "w") as f:
    json.dump(record, f)
os.replace(os.environ["FAKE_RECORD"] + ".part", os.environ["FAKE_RECORD"])
if os.environ.get("FAKE_WAIT"):
    import time
    time.sleep(120)
sys.exit(int(os.environ.get("FAKE_EXIT", "0")))
"""


@pytest.fixture(scope="module")
def long_pair(tmp_path_factory):
    """A tiny llama pair with a 64K context, enough for every client."""
    root = tmp_path_factory.mktemp("long")
    t = tiny.make_target(root / "target", "llama", max_position_embeddings=65536)
    return str(t), str(tiny.make_draft(root / "draft", t))


def fake_clients(folder: Path, *names: str) -> dict:
    """An environment whose PATH starts with fake `names` executables."""
    folder.mkdir(exist_ok=True)
    for name in names:
        exe = folder / name
        exe.write_text(FAKE.format(python=sys.executable))
        exe.chmod(0o755)
    record = folder / "record.json"
    path = f"{folder}{os.pathsep}{os.environ['PATH']}"
    return {**os.environ, "PATH": path, "FAKE_RECORD": str(record), "COLUMNS": "200"}


def launch(env, *args, timeout=300) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "dflash_mlx.cli.main", "launch", *args]
    return subprocess.run(command, env=env, capture_output=True, text=True,
                          timeout=timeout)  # fmt: skip


def default_sigint():
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def closed(url: str) -> bool:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    try:
        socket.create_connection((host, int(port)), timeout=2).close()
    except OSError:
        return True
    return False


def started_at(stderr: str) -> str:
    found = re.search(r"(?:started|reusing) the server at (http://\S+)", stderr)
    assert found, stderr
    return found.group(1)


def test_claude_gets_the_server_and_the_server_stops_with_it(long_pair, tmp_path):
    t, d = long_pair
    env = {**fake_clients(tmp_path / "bin", "claude"), "FAKE_EXIT": "3"}
    done = launch(env, "claude", "--model", t, "--draft", d, "--", "-p", "hi there")
    assert done.returncode == 3, done.stderr  # the client's status, forwarded
    url = started_at(done.stderr)
    record = json.loads((tmp_path / "bin" / "record.json").read_text())
    assert record["argv"] == ["-p", "hi there"]
    seen = record["env"]
    assert seen["ANTHROPIC_BASE_URL"] == url
    assert seen["ANTHROPIC_AUTH_TOKEN"] == "local"
    assert seen["ANTHROPIC_MODEL"] == seen["ANTHROPIC_DEFAULT_HAIKU_MODEL"] == "target"
    # the server answered while the client ran, with the context it checked
    assert record["health"][0]["model"] == "target"
    assert record["health"][0]["context_length"] == 65536
    assert closed(url)  # and is gone once the client exited


def test_codex_reuses_a_running_server_and_leaves_it_running(long_pair, tmp_path):
    t, d = long_pair
    env = fake_clients(tmp_path / "bin", "codex")
    command = [sys.executable, "-m", "dflash_mlx.cli.main", "serve", "--port", "0",
               "--model", t, "--draft", d, "--model-name", "tiny"]  # fmt: skip
    server = subprocess.Popen(command, stdout=subprocess.PIPE, text=True,
                              stderr=subprocess.STDOUT, env=env)  # fmt: skip
    try:
        for line in server.stdout:
            found = re.search(r"Ready at (http://\S+):(\d+)/v1", line)
            if found:
                break
        assert found, "the server never got ready"
        port = found.group(2)
        done = launch(env, "codex", "--port", port, "--", "exec", "hello")
        assert done.returncode == 0, done.stderr
        url = started_at(done.stderr)
        assert "reusing" in done.stderr and url.endswith(":" + port)
        record = json.loads((tmp_path / "bin" / "record.json").read_text())
        argv = record["argv"]
        assert argv[-2:] == ["exec", "hello"]
        overrides = [argv[i + 1] for i, a in enumerate(argv) if a == "-c"]
        assert 'model_provider="dflash-mlx"' in overrides
        assert 'model="tiny"' in overrides
        assert f'model_providers.dflash-mlx.base_url="{url}/v1"' in overrides
        assert 'model_providers.dflash-mlx.wire_api="responses"' in overrides
        assert record["env"]["DFLASH_MLX_API_KEY"] == "local"
        assert health(url) is not None  # not ours to stop
        assert "warning" not in done.stderr
        # asked for another model than the one served: said, and the client still runs
        other = launch(env, "codex", "--port", port, "--model", "org/other-model")
        assert other.returncode == 0, other.stderr
        said = " ".join(other.stderr.split())
        assert "serves 'tiny', not 'org/other-model'" in said, other.stderr
        assert "another --port" in said
    finally:
        server.terminate()
        server.wait(30)


def test_a_context_too_small_is_refused_before_the_client_starts(tiny_pair, tmp_path):
    t, d = tiny_pair("llama")  # a 4096-token context
    env = fake_clients(tmp_path / "bin", "claude")
    done = launch(env, "claude", "--model", str(t), "--draft", str(d))
    assert done.returncode == 1
    assert "needs about 20000 tokens" in done.stderr and "has 4096" in done.stderr
    assert not (tmp_path / "bin" / "record.json").exists()  # never started
    assert closed(started_at(done.stderr))


def test_a_client_not_installed_says_how_to_install_it(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no claude there
    result = CliRunner().invoke(app, ["launch", "claude"], env={"COLUMNS": "300"})
    assert result.exit_code == 1
    out = " ".join(result.output.split())
    assert "Claude Code is not installed" in out
    assert "npm install -g @anthropic-ai/claude-code" in out


def test_an_unknown_client_names_the_choices():
    result = CliRunner().invoke(app, ["launch", "vim"], env={"COLUMNS": "300"})
    assert result.exit_code == 2
    assert "Unknown client 'vim'" in result.output and "claude" in result.output


@pytest.mark.parametrize("name", sorted(AGENTS))
def test_every_client_is_pointed_at_the_server(name, tmp_path):
    agent = find_agent(name)
    endpoint = Endpoint("http://127.0.0.1:4321", "org/model-x", "sekret", 32768)
    setup = agent.configure(endpoint, tmp_path)
    written = " ".join(p.read_text() for p in tmp_path.rglob("*") if p.is_file())
    before = [word for command in setup.before for word in command]
    seen = " ".join([*setup.env.values(), *setup.args, *before, written])
    assert "http://127.0.0.1:4321" in seen  # the URL, the model and the key reach it
    assert "org/model-x" in seen and "sekret" in seen
    for value in setup.env.values():  # config files named in the env exist
        if value.startswith(str(tmp_path)):
            assert Path(value).exists()


def test_context_check_names_the_number():
    needs_context(find_agent("claude"), None)  # unknown: not refused
    needs_context(find_agent("claude"), 20000)
    with pytest.raises(ValueError, match="about 8000 tokens.*has 4096"):
        needs_context(find_agent("codex"), 4096)


def test_a_server_that_cannot_start_is_reported_with_its_log(tmp_path):
    env = fake_clients(tmp_path / "bin", "claude")
    done = launch(env, "claude", "--model", str(tmp_path / "no-such-model"))
    assert done.returncode == 1
    assert "The server did not start" in done.stderr
    assert "no-such-model" in done.stderr  # the server's own error, from its log
    assert not (tmp_path / "bin" / "record.json").exists()


def test_ctrl_c_reaches_the_client_and_the_server_stops_with_it(long_pair, tmp_path):
    t, d = long_pair
    env = {**fake_clients(tmp_path / "bin", "claude"), "FAKE_WAIT": "1"}
    command = [sys.executable, "-m", "dflash_mlx.cli.main", "launch", "claude",
               "--model", t, "--draft", d]  # fmt: skip
    # its own session stands for the terminal's foreground process group; Ctrl-C's
    # default action, as a terminal has it (a shell's background job ignores SIGINT,
    # and the ignoring is inherited: CI run with `&` would never see the Ctrl-C)
    proc = subprocess.Popen(command, env=env, stderr=subprocess.PIPE, text=True,
                            start_new_session=True,
                            preexec_fn=default_sigint)  # fmt: skip
    record = tmp_path / "bin" / "record.json"
    try:
        deadline = time.monotonic() + 120
        while not record.exists():
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.1)
        url = json.loads(record.read_text())["env"]["ANTHROPIC_BASE_URL"]
        os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C: launch and the client get it
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 128 + signal.SIGINT  # the client's end, forwarded
    assert "launch.py" not in err  # launch itself ignored the Ctrl-C: no traceback
    assert closed(url)
