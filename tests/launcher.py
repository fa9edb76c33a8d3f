"""Running commands on two local ranks with `mlx.launch` (ring backend, 127.0.0.1)."""

import os
import random
import signal
import subprocess
import sys
from pathlib import Path

import mlx.core as mx
import pytest

LAUNCH = Path(sys.executable).with_name("mlx.launch")
needs_two_ranks = pytest.mark.skipif(
    not (LAUNCH.exists() and mx.distributed.is_available()),
    reason="this MLX build cannot start local ranks (no mlx.launch or no backend)",
)


def command(*args: str) -> list[str]:
    """`mlx.launch -n 2 --backend ring -- args...` on a random port range."""
    port = str(random.randint(20000, 40000))
    return [str(LAUNCH), "-n", "2", "--backend", "ring", "--starting-port", port, "--",
            *args]  # fmt: skip


def start(*args: str, **kw) -> subprocess.Popen:
    """Launch in its own session, so `stop` ends the launcher and both ranks."""
    return subprocess.Popen(
        command(*args), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True, **kw,
    )  # fmt: skip


def stop(proc: subprocess.Popen, sig=signal.SIGKILL):
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass


def run(*args: str, timeout: float = 900, **kw) -> subprocess.CompletedProcess:
    proc = start(*args, **kw)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        stop(proc)
        raise
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
