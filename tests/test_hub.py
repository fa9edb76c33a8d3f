"""The Hub path every real user takes, against a fake Hub on localhost (fake_hub.py).

Each step runs in a fresh process: huggingface_hub reads HF_ENDPOINT, HF_HOME and
HF_HUB_OFFLINE when it is imported. The cache is a temporary HF_HOME.
"""

import json
import os
import subprocess
import sys

import pytest
from fake_hub import FakeHub

TARGET, DRAFT = "tiny-org/qwen3-target", "tiny-org/qwen3-dflash"
TIMEOUT = 240


@pytest.fixture
def hub(tiny_pair, tmp_path):
    t, d = tiny_pair("qwen3")
    server = FakeHub({TARGET: t, DRAFT: d})
    server.home = tmp_path / "hf-home"
    yield server
    server.close()


def _env(hub, offline: bool = False) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGING"))}
    env.update(
        HF_ENDPOINT=hub.url,
        HF_HOME=str(hub.home),
        HF_HUB_DISABLE_TELEMETRY="1",
        HF_HUB_DISABLE_XET="1",
        HF_HUB_OFFLINE="1" if offline else "0",
        NO_PROXY="127.0.0.1,localhost",
        DFLASH_MLX_NO_REEXEC="1",
    )
    return env


def _cli(hub, *args, offline: bool = False):
    command = [sys.executable, "-m", "dflash_mlx.cli.main", *args]
    return subprocess.run(
        command,
        env=_env(hub, offline),
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )


# huggingface_hub reads downloads in 10 MB chunks and resumes from the last whole one;
# the tiny files here are smaller, so a smaller chunk lets a cut land after some.
CHUNK = 64 * 1024

# Loads each spec (a target, or a drafter with "draft:") and prints one JSON line per
# spec: {"ok": ...} or {"error": message}.
LOADER = f"""
import json, sys
import huggingface_hub.constants
huggingface_hub.constants.DOWNLOAD_CHUNK_SIZE = {CHUNK}
from dflash_mlx import load, load_draft
for spec in sys.argv[1:]:
    try:
        if spec.startswith("draft:"):
            load_draft(spec[6:])
        else:
            load(spec)
        print(json.dumps({{"ok": spec}}))
    except ValueError as e:
        print(json.dumps({{"error": str(e)}}))
"""


def _load(hub, *specs, offline: bool = False) -> list[dict]:
    r = subprocess.run(
        [sys.executable, "-c", LOADER, *specs],
        env=_env(hub, offline),
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    return [json.loads(line) for line in r.stdout.splitlines()]


def test_first_run_downloads_with_progress_then_works_offline(hub):
    args = ["generate", "-p", "Hello", "-m", TARGET, "-d", DRAFT, "-n", "4", "--json"]
    first = _cli(hub, *args)
    assert first.returncode == 0, first.stderr
    assert json.loads(first.stdout)["draft"] == DRAFT
    assert "Fetching" in first.stderr  # huggingface_hub's progress bars, on stderr
    got = {p.rsplit("/", 1)[-1] for m, p, _ in hub.requests if m == "GET"}
    assert {"model.safetensors", "config.json", "tokenizer.json"} <= got
    snapshots = hub.home / "hub" / "models--tiny-org--qwen3-target" / "snapshots"
    assert (snapshots / hub.sha(TARGET) / "model.safetensors").is_file()

    hub.requests.clear()
    again = _cli(hub, *args, offline=True)
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["text"] == json.loads(first.stdout)["text"]
    assert hub.requests == []  # all from the cache


def test_an_interrupted_download_resumes(hub):
    data = (hub.repos[DRAFT] / "model.safetensors").read_bytes()
    cut = len(data) // 3
    hub.cut[(DRAFT, "model.safetensors")] = cut
    assert _load(hub, f"draft:{DRAFT}") == [{"ok": f"draft:{DRAFT}"}]
    gets = [r for m, r in hub.downloads("model.safetensors") if m == "GET"]
    # the connection dropped after `cut` bytes: the retry asked for the rest only,
    # from the last whole chunk written
    assert gets == [None, f"bytes={cut // CHUNK * CHUNK}-"] and cut >= CHUNK
    repo = hub.home / "hub" / "models--tiny-org--qwen3-dflash"
    got = repo / "snapshots" / hub.sha(DRAFT) / "model.safetensors"
    assert got.read_bytes() == data


def test_a_failed_download_says_to_run_again_and_then_works(hub):
    hub.cut[(DRAFT, "model.safetensors")] = 1000
    hub.fail_retry = True  # the retry after the cut fails too
    failed, again = _load(hub, f"draft:{DRAFT}", f"draft:{DRAFT}")
    assert f"Drafter '{DRAFT}' could not be downloaded" in failed["error"]
    assert "500" in failed["error"] and "run the same command again" in failed["error"]
    assert again == {"ok": f"draft:{DRAFT}"}


def test_missing_repo_missing_file_and_gated_repo_say_how_to_fix(hub):
    hub.gated.add(DRAFT)
    hub.missing.add((TARGET, "model.safetensors"))
    absent, missing_file, gated = _load(
        hub, "tiny-org/no-such-model", TARGET, f"draft:{DRAFT}"
    )
    assert "'tiny-org/no-such-model' was not found" in absent["error"]
    assert "hf auth login" in absent["error"]
    assert f"'{TARGET}'" in missing_file["error"]
    assert "cannot be downloaded" in missing_file["error"]
    assert "model.safetensors" in missing_file["error"]
    assert str(hub.home / "hub") in missing_file["error"]
    assert f"'{DRAFT}' is gated" in gated["error"]
    assert "hf auth login" in gated["error"]
    assert f"huggingface.co/{DRAFT}" in gated["error"]


def test_offline_without_the_files_names_the_cache_and_the_command(hub):
    (error,) = _load(hub, TARGET, offline=True)
    message = error["error"]
    assert "HF_HUB_OFFLINE is set" in message
    assert f"hf download {TARGET}" in message
    assert str(hub.home / "hub") in message
    assert hub.requests == []
