"""The commands under `mlx.launch -n 2`: rank 0 alone speaks, and says what one process
would."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import launcher
import pytest
import tiny

pytestmark = [launcher.needs_two_ranks, pytest.mark.slow]  # make test-all
CLI = str(Path(sys.executable).with_name("dflash-mlx"))
ENV = {**os.environ, "DFLASH_MLX_NO_REEXEC": "1"}


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("dist-cli")
    target = tiny.make_target(root / "target", "qwen3")
    return str(target), str(tiny.make_draft(root / "draft", target))


def _generate(pair, *extra) -> list[str]:
    return [CLI, "generate", "-m", pair[0], "-d", pair[1], "--prompt", "hello world",
            "-n", "20", "--json", *extra]  # fmt: skip


@pytest.mark.parametrize("temp", ["0", "0.8"])
def test_generate_json_on_two_ranks_equals_one_process(pair, temp):
    args = _generate(pair, "--temp", temp, "--seed", "5")
    proc = launcher.run(*args, timeout=300, env=ENV)
    assert proc.returncode == 0, proc.stderr
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    assert len(lines) == 1  # rank 0 alone prints
    record = json.loads(lines[0])
    assert record["distributed"] == {"backend": "ring", "size": 2, "sharding": "tensor"}
    alone = subprocess.run(args, capture_output=True, text=True, env=ENV, check=True)
    single = json.loads(alone.stdout)
    assert single["distributed"] is None and record["tokens"] == single["tokens"]


def test_bench_on_two_ranks(pair, tmp_path):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('"hello world"\n"The quick brown fox"\n')
    out = tmp_path / "bench.json"
    proc = launcher.run(
        CLI, "bench", "-m", pair[0], "--draft", pair[1], "-d", str(prompts),
        "--max-tokens", "16", "-b", "4,auto", "--json", str(out),
        timeout=300, env=ENV,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["lossless"] and summary["failures"] == 0
    assert proc.stdout.count('"lossless"') == 1  # one summary line: rank 0's
    report = json.loads(out.read_text())
    assert report["environment"]["distributed"]["size"] == 2


def test_serve_on_two_ranks_answers_through_rank_0(pair):
    port = str(20000 + os.getpid() % 20000)
    server = launcher.start(
        CLI, "serve", "-m", pair[0], "-d", pair[1], "--port", port, env=ENV
    )
    try:
        url = f"http://127.0.0.1:{port}"
        for _ in range(300):
            try:
                if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.5)
        body = {"prompt": "hello world", "max_tokens": 20, "temperature": 0}
        answers = [
            httpx.post(f"{url}/v1/completions", json=body, timeout=120).json()
            for _ in range(2)  # the second one reuses the pooled caches on every rank
        ]
    finally:
        launcher.stop(server)
    alone = subprocess.run(
        _generate(pair, "--raw"), capture_output=True, text=True, env=ENV, check=True
    )
    text = json.loads(alone.stdout)["text"]
    assert [a["choices"][0]["text"] for a in answers] == [text, text]
    assert answers[1]["usage"]["prompt_tokens_details"]["cached_tokens"] > 0


def test_doctor_reports_the_group():
    proc = launcher.run(CLI, "doctor", "--matmul-size", "0", "--json", timeout=120)
    reports = [json.loads(ln) for ln in proc.stdout.splitlines() if ln.startswith("{")]
    assert len(reports) == 1  # rank 0's
    assert reports[0]["distributed"] == {
        "backend": "ring", "size": 2, "sharding": "tensor", "rank": 0,
    }  # fmt: skip
    alone = subprocess.run([CLI, "doctor", "--matmul-size", "0", "--json"],
                           capture_output=True, text=True, env=ENV)  # fmt: skip
    assert json.loads(alone.stdout)["distributed"] is None
