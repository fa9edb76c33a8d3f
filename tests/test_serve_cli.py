"""`dflash-mlx serve` as a real process: startup lines, an `openai` stream, a clean stop
on SIGTERM that ends in-flight streams with an error event; and the CLI's checks."""

import json
import os
import re
import signal
import socket
import subprocess
import sys

import httpx
import openai
import pytest
from typer.testing import CliRunner

from dflash_mlx.cli.main import app
from dflash_mlx.cli.serve import host_warning, parse_bytes

runner = CliRunner()


@pytest.fixture(scope="module")
def paths(tiny_pair):
    t, d = tiny_pair("llama")
    return str(t), str(d)


def start(*args) -> tuple[subprocess.Popen, str, list[str]]:
    """The server process, its base URL and the lines it printed up to 'Ready'."""
    env = {**os.environ, "COLUMNS": "200"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "dflash_mlx.cli.main", "serve", "--port", "0", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    lines = []
    for line in proc.stdout:
        lines.append(line)
        found = re.search(r"Ready at (http://\S+)/v1", line)
        if found:
            return proc, found.group(1), lines
    proc.wait(10)
    raise AssertionError("the server never got ready:\n" + "".join(lines))


def test_serve_streams_to_openai_and_stops_cleanly_on_sigterm(paths):
    t, d = paths
    proc, url, lines = start("--model", t, "--draft", d, "--model-name", "tiny")
    try:
        banner = "".join(lines)
        assert "dflash-mlx serve" in banner and "tiny" in banner and d in banner
        assert "BLAS" in banner and "device" in banner
        client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0)
        chunks = client.chat.completions.create(
            model="tiny",
            messages=[{"role": "user", "content": "hello"}],
            max_tokens=8,
            stream=True,
        )
        assert sum(bool(c.choices and c.choices[0].delta.content) for c in chunks) > 0
        body = {
            "model": "tiny",
            "messages": [{"role": "user", "content": "What is 2+2?"}],
            "max_tokens": 600,
            "stream": True,
        }
        with httpx.stream("POST", url + "/v1/chat/completions", json=body) as r:
            data = (line[6:] for line in r.iter_lines() if line.startswith("data: "))
            next(data), next(data)  # the role chunk, then generated text
            proc.send_signal(signal.SIGTERM)
            rest = list(data)
        assert "[DONE]" not in rest
        assert json.loads(rest[-1])["error"]["code"] == "server_shutting_down"
        assert proc.wait(30) == 0
        tail = " ".join(proc.stdout.read().split())
        assert "Server stopped." in tail
        assert f"Dashboard {url}/ chat {url}/chat" in tail  # the line after Ready
    finally:
        if proc.poll() is None:
            proc.kill()


def test_no_ui_serves_the_api_without_the_pages(paths):
    t, d = paths
    proc, url, _ = start("--model", t, "--draft", d, "--no-ui")
    try:
        page = httpx.get(url + "/", headers={"Accept": "text/html"})
        assert page.json() == {"status": "ok", "api": "/v1"}
        assert httpx.get(url + "/chat").status_code == 404
        assert httpx.get(url + "/v1/models").status_code == 200
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
        assert "Dashboard" not in proc.stdout.read()
    finally:
        if proc.poll() is None:
            proc.kill()


def test_missing_serve_extra_says_how_to_install_it():
    code = (
        "import sys; sys.modules['fastapi'] = None; "
        "from dflash_mlx.cli.main import app; app(['serve'])"
    )
    r = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 1
    said = " ".join(r.stdout.split())  # Rich wraps long lines
    assert "pip install fastapi uvicorn" in said and "Traceback" not in r.stderr


def test_a_busy_port_fails_before_loading_anything():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        r = runner.invoke(app, ["serve", "--port", str(port), "-m", "/nonexistent"])
    said = " ".join(r.output.split())
    assert (
        r.exit_code == 1 and "Cannot listen on 127.0.0.1" in said and "--port" in said
    )


def test_bad_options_are_usage_errors():
    assert runner.invoke(app, ["serve", "--port", "70000"]).exit_code == 2
    r = runner.invoke(app, ["serve", "--prompt-cache-bytes", "lots"])
    assert r.exit_code == 2 and "512M" in " ".join(r.output.split())
    assert runner.invoke(app, ["serve", "--block-size", "0"]).exit_code == 2


def test_sizes_and_the_open_host_warning():
    assert parse_bytes("2G", "x") == 2 << 30 and parse_bytes("512MiB", "x") == 512 << 20
    assert parse_bytes("1000", "x") == 1000 and parse_bytes("0", "x") == 0
    assert host_warning("127.0.0.1", None) is None
    assert host_warning("0.0.0.0", "key") is None
    assert "--api-key" in host_warning("0.0.0.0", None)
