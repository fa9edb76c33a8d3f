"""`dflash-mlx launch`: an agent client started already pointed at a server.

A server already answering /health at the address is reused; otherwise `dflash-mlx
serve` starts as a child process in its own session (so the client's Ctrl-C stays the
client's), its output in a log file. Once it is up and the model's context is known to
be large enough for the client, the client runs with its settings
(`agents.Agent.configure`); when the client exits, a server this started stops.
"""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from .agents import Agent, Endpoint, needs_context


@dataclass
class Server:
    url: str
    health: dict
    process: subprocess.Popen | None = None  # None: reused, not ours to stop
    log: Path | None = None


def require_installed(agent: Agent, path: str | None = None) -> str:
    """The client's executable; ValueError saying how to install it."""
    found = shutil.which(agent.executable, path=path)
    if found is None:
        raise ValueError(
            f"{agent.title} is not installed (no `{agent.executable}` on PATH). "
            f"Install it with `{agent.install}`, then run this again."
        )
    return found


def health(url: str, api_key: str | None = None, timeout: float = 2.0) -> dict | None:
    """The server's /health answer, or None when nothing answers there."""
    request = urllib.request.Request(url + "/health")
    if api_key:
        request.add_header("Authorization", f"Bearer {api_key}")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as r:
            answer = json.loads(r.read())
    except (OSError, ValueError):
        return None
    return answer if isinstance(answer, dict) and answer.get("status") else None


def base_url(host: str, port: int) -> str:
    shown = "127.0.0.1" if host in ("0.0.0.0", "") else host
    return f"http://{f'[{shown}]' if ':' in shown else shown}:{port}"


def free_port(host: str) -> int:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def start_server(
    serve_args: list[str],
    host: str,
    port: int | None,
    api_key: str | None,
    log: Path,
    wait: float = 900.0,
) -> Server:
    """Reuse the server answering at host:port, or start one and wait until its
    /health answers; ValueError with its log's tail when it exits first."""
    if port is not None:
        found = health(base_url(host, port), api_key)
        if found is not None:
            return Server(base_url(host, port), found)
    port = free_port(host) if port is None else port
    url = base_url(host, port)
    command = [sys.executable, "-m", "dflash_mlx.cli.main", "serve", *serve_args]
    command += ["--host", host, "--port", str(port)]
    env = dict(os.environ)
    if api_key:
        env["DFLASH_MLX_API_KEY"] = api_key
    with open(log, "wb") as out:
        process = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
    server = Server(url, {}, process, log)
    deadline = time.monotonic() + wait
    try:
        while time.monotonic() < deadline:
            found = health(url, api_key, timeout=1.0)
            if found is not None:
                server.health = found
                return server
            if process.poll() is not None:
                break
            time.sleep(0.25)
    finally:  # Ctrl-C while it loads: the server (in its own session) stops too
        if not server.health:
            stop_server(server)
    raise ValueError(
        f"The server did not start (log: {log}):\n" + _tail(log)
        if process.returncode not in (None, -signal.SIGTERM)
        else f"The server did not answer within {wait:.0f} s (log: {log})."
    )


def stop_server(server: Server, grace: float = 15.0):
    """End a server this started (SIGTERM, then SIGKILL after `grace` seconds)."""
    process = server.process
    if process is None or process.poll() is not None:
        return
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(grace)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def run_client(agent: Agent, server: Server, args: list[str], api_key: str | None):
    """Run the client pointed at `server` until it exits; its exit status."""
    endpoint = Endpoint(
        url=server.url,
        model=server.health.get("model") or "local",
        api_key=api_key or "local",
        context=server.health.get("context_length"),
    )
    needs_context(agent, endpoint.context)
    executable = require_installed(agent)
    with tempfile.TemporaryDirectory(prefix=f"dflash-{agent.name}-") as folder:
        setup = agent.configure(endpoint, Path(folder))
        env = {**os.environ, **setup.env}
        for command in setup.before:
            done = subprocess.run(command, env=env, stdin=subprocess.DEVNULL,
                                  capture_output=True, text=True)  # fmt: skip
            if done.returncode != 0:
                raise ValueError(
                    f"`{' '.join(command[:2])}` failed ({done.returncode}):\n"
                    + (done.stderr or done.stdout).strip()[-2000:]
                )
        client = subprocess.Popen([executable, *setup.args, *args], env=env)
        # Ctrl-C reaches the client from the terminal: it decides whether to exit
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            code = client.wait()
            return 128 - code if code < 0 else code  # killed by a signal: 128 + it
        finally:
            signal.signal(signal.SIGINT, previous)
            if client.poll() is None:  # this process was told to stop
                client.terminate()
                client.wait()


def launch(
    agent: Agent,
    client_args: list[str],
    serve_args: list[str],
    host: str = "127.0.0.1",
    port: int | None = None,
    api_key: str | None = None,
    on_server=None,
) -> int:
    """Start (or reuse) a server, run the client against it, stop what was started;
    the client's exit status. `on_server(server)` is told once the server is up."""
    require_installed(agent)  # before a model loads
    log = Path(tempfile.mkstemp(prefix="dflash-mlx-serve-", suffix=".log")[1])
    server = start_server(serve_args, host, port, api_key, log)
    previous = signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        if on_server is not None:
            on_server(server)
        return run_client(agent, server, client_args, api_key)
    finally:
        signal.signal(signal.SIGTERM, previous)
        stop_server(server)
        log.unlink(missing_ok=True)


def _exit_on_sigterm(signum, frame):
    raise SystemExit(128 + signum)  # the finally clauses stop the client and server


def _tail(path: Path, lines: int = 20) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])
