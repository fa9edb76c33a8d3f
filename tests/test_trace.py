"""The batched engine's step trace (`serve --trace`): off, nothing changes; on, each
step's record says what the step did and where its time went, and the tokens are
the ones an untraced batch commits."""

import json

import pytest
from lossless import plain
from test_batch import TEXTS, _pair, _run
from typer.testing import CliRunner

from dflash_mlx.cli.main import app
from dflash_mlx.engine.batch import Batch, Request
from dflash_mlx.engine.policy import AdaptiveBlockSize
from dflash_mlx.engine.trace import StepTrace

N = 16


def _records(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.parametrize("policy", [4, "auto"])
def test_a_traced_batch_commits_the_same_tokens_and_records_each_step(
    tiny_pair, tmp_path, policy
):
    target, draft, model, tok = _pair(tiny_pair, "qwen3")
    prompts = [tok.encode(t) for t in TEXTS]
    stops = frozenset(tok.eos_token_ids)
    requests = [Request(max_tokens=N, stop_tokens=stops) for _ in prompts]
    expected = [plain(model, tok, ids, N) for ids in prompts]
    path = tmp_path / "trace.jsonl"
    batch = Batch(target, draft, AdaptiveBlockSize(8) if policy == "auto" else policy)
    batch.trace = StepTrace.open(path)
    got = _run(batch, target, draft, prompts, requests, [0, 0, 1, 3])
    batch.trace.close()
    assert got == [e[:N] for e in expected]
    steps = _records(path)
    assert steps and all(r["kind"] == "step" for r in steps)
    committed = sum(len(g) - 1 for g in got)  # the prefill's token is not a step's
    assert sum(r["tokens"] for r in steps) == committed
    for r in steps:
        assert 1 <= r["rows"] <= r["width"] and len(r["accepted"]) == r["rows"]
        assert r["verify_ms"] > 0 and r["step_ms"] >= r["verify_ms"]
        drafted = r["size"] > 1
        assert ("draft_ms" in r) == ("upkeep_ms" in r) == drafted
        assert r["syncs"] == (3 if drafted else 1)
    assert max(r["rows"] for r in steps) > 1  # sequences verified together
    if policy == "auto":
        assert any(r["rates"] for r in steps)  # what the choice was made from


def test_an_unwritable_trace_path_is_refused_before_anything_loads(tmp_path):
    with pytest.raises(ValueError, match="is a folder"):
        StepTrace.open(tmp_path)
    result = CliRunner().invoke(
        app, ["serve", "--trace", str(tmp_path / "no" / "such" / "t.jsonl")]
    )
    said = " ".join(result.output.split())
    assert result.exit_code == 2 and "Cannot write the trace" in said


def test_a_server_started_with_a_trace_records_prefills_and_steps(tiny_pair, tmp_path):
    import httpx
    from serve_helpers import LiveServer

    from dflash_mlx import load, load_draft

    t, d = tiny_pair("qwen3")
    model, tok = load(str(t))
    draft = load_draft(str(d), target=model)
    path = tmp_path / "serve-trace.jsonl"
    with LiveServer(model, tok, draft, block_size=4, trace=str(path)) as s:
        body = {"model": "tiny", "prompt": "1, 2, 3, 4,", "max_tokens": 12}
        r = httpx.post(f"{s.url}/v1/completions", json=body, timeout=60)
        assert r.status_code == 200
        s.wait_idle()
    records = _records(path)
    kinds = [r["kind"] for r in records]
    assert kinds[0] == "prefill" and "step" in kinds
    assert records[0]["tokens"] == records[0]["context"] > 0
    assert records[0]["prefill_ms"] > 0
