"""`dflash-mlx bench`: runs, records, summary, losslessness check, CLI, JSON schema."""

import json

import pytest
from rich.console import Console
from typer.testing import CliRunner

from dflash_mlx import bench
from dflash_mlx.cli.bench import BenchOptions, execute, resolve_models
from dflash_mlx.cli.main import app

RECORD_KEYS = {
    "dataset",
    "sample",
    "turn",
    "engine",
    "block_size",
    "prompt_tokens",
    "tokens",
    "ttft_s",
    "decode_s",
    "decode_tps",
    "accept_lengths",
    "sources",
    "proposed",
    "taken",
    "mean_tau",
    "peak_memory_gb",
    "lossless",
    "first_mismatch",
    "exactness",
}
ROW_KEYS = {
    "dataset",
    "engine",
    "block_size",
    "prompts",
    "tokens",
    "baseline_tps",
    "tps",
    "speedup",
    "mean_tau",
    "tau_histogram",
    "baseline_ttft_s",
    "ttft_s",
    "peak_memory_gb",
    "baseline_peak_memory_gb",
    "lossless_failures",
    "near_ties",
    "sources",
    "plain_tps",
    "speedup_vs_plain",
}
ENV_KEYS = {
    "platform",
    "machine",
    "cpu",
    "device",
    "blas",
    "python",
    "mlx",
    "mlx_lm",
    "dflash_mlx",
    "model",
    "draft",
    "model_type",
    "model_weights",
    "draft_weights",
}


@pytest.fixture(scope="module")
def pair(tiny_pair):
    return tiny_pair("qwen3")


def _invoke(*args):
    result = CliRunner().invoke(app, ["bench", *map(str, args)])
    return result, result.output.strip().splitlines()


def test_all_datasets_two_samples_json_schema(pair, tmp_path):
    target, draft = pair
    out = tmp_path / "bench.json"
    result, lines = _invoke(
        "--model",
        target,
        "--draft",
        draft,
        "--dataset",
        "all",
        "--max-samples",
        2,
        "--max-tokens",
        6,
        "--json",
        out,
    )
    assert result.exit_code == 0, result.output
    last = json.loads(lines[-1])
    assert last["lossless"] is True and last["failures"] == 0
    assert [r["dataset"] for r in last["rows"]] == [
        "gsm8k",
        "math500",
        "humaneval",
        "mbpp",
        "mt-bench",
        "all",
    ]
    for name in ("environment", "decode speed", "acceptance lengths", "BLAS"):
        assert name in result.output or name.lower() in result.output

    report = json.loads(out.read_text())
    assert report["schema"] == bench.SCHEMA
    assert set(report) == {"schema", "config", "environment", "records", "summary"}
    assert report["config"]["datasets"] == [
        "gsm8k",
        "math500",
        "humaneval",
        "mbpp",
        "mt-bench",
    ]
    assert ENV_KEYS <= set(report["environment"])
    records = report["records"]
    # 2 samples × 4 one-turn sets + 2 × 2 mt-bench turns = 12 turns, baseline + dflash
    assert len(records) == 24
    assert all(set(r) == RECORD_KEYS for r in records)
    assert {
        (r["dataset"], r["turn"]) for r in records if r["dataset"] == "mt-bench"
    } == {("mt-bench", 0), ("mt-bench", 1)}
    turn2 = [r for r in records if r["turn"] == 1]
    turn1 = {
        r["sample"]: r for r in records if r["turn"] == 0 and r["dataset"] == "mt-bench"
    }
    assert all(r["prompt_tokens"] > turn1[r["sample"]]["prompt_tokens"] for r in turn2)
    for r in records:
        assert r["tokens"] == 6 and r["ttft_s"] > 0 and r["decode_tps"] > 0
        if r["engine"] == "baseline":
            assert (
                r["block_size"] == 1
                and r["lossless"] is None
                and not r["accept_lengths"]
            )
        else:
            assert (
                r["engine"] == "dflash"
                and r["block_size"] == "auto"
                and r["lossless"] is True
            )
            assert sum(r["accept_lengths"]) == r["tokens"] - 1
    summary = report["summary"]
    assert summary["lossless"] is True and summary["failures"] == []
    assert all(set(row) == ROW_KEYS for row in summary["rows"])
    assert all(
        1 <= len(row["tau_histogram"]) <= 8 for row in summary["rows"]
    )  # auto: up to B
    assert summary["rows"][-1]["prompts"] == 12


def _tampered(engine):
    def run(ids, max_tokens, block_size):
        for n, (tokens, *rest) in enumerate(engine(ids, max_tokens, block_size)):
            if n == 2:
                tokens = [tokens[0] + 1] + tokens[1:]
            yield tokens, *rest

    return run


def test_non_lossless_engine_fails_loudly(pair, tmp_path):
    from dflash_mlx import load, load_draft

    target, draft = pair
    model, tokenizer = load(str(target))
    good = bench.dflash_engine(model, load_draft(str(draft)), tokenizer)
    console = Console(record=True, width=120)
    opts = BenchOptions(
        "gsm8k,mt-bench",
        str(target),
        str(draft),
        max_samples=1,
        max_tokens=6,
        json_out=tmp_path / "bad.json",
    )
    code = execute(opts, out=console, engines={"dflash": _tampered(good)})
    assert code != 0
    assert "LOSSLESSNESS FAILURE" in console.export_text()
    summary = json.loads((tmp_path / "bad.json").read_text())["summary"]
    assert summary["lossless"] is False
    assert len(summary["failures"]) == 3  # every turn: 1 gsm8k + 2 mt-bench
    assert {f["first_mismatch"] for f in summary["failures"]} == {2}


def test_block_size_sweep_gives_one_row_per_size(pair, tmp_path):
    target, draft = pair
    result, lines = _invoke(
        "--model",
        target,
        "--draft",
        draft,
        "--dataset",
        "mbpp",
        "--max-samples",
        2,
        "--max-tokens",
        5,
        "--block-size",
        "2,4,16",
    )
    assert result.exit_code == 0, result.output
    rows = json.loads(lines[-1])["rows"]
    # 16 is above the tiny drafter's 8: measured at 8, with a note saying so
    assert [(r["dataset"], r["block_size"]) for r in rows] == [
        ("mbpp", 2),
        ("mbpp", 4),
        ("mbpp", 8),
    ]
    assert "block size 16 is above the drafter's 8: using 8" in result.output


def test_auto_block_size_row(pair):
    target, draft = pair
    result, lines = _invoke(
        "--model",
        target,
        "--draft",
        draft,
        "--dataset",
        "gsm8k",
        "--max-samples",
        2,
        "--max-tokens",
        12,
        "--block-size",
        "4,auto",
    )
    assert result.exit_code == 0, result.output
    summary = json.loads(lines[-1])
    assert summary["lossless"] is True
    assert [r["block_size"] for r in summary["rows"]] == [4, "auto"]


def test_custom_jsonl_and_sampling(pair, tmp_path):
    target, draft = pair
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"turns": ["hello", "and again"]}\n"just text"\n')
    out = tmp_path / "r.json"
    result, lines = _invoke(
        "--model",
        target,
        "--draft",
        draft,
        "--dataset",
        prompts,
        "--max-tokens",
        4,
        "--temp",
        0.8,
        "--json",
        out,
    )
    assert result.exit_code == 0, result.output
    records = json.loads(out.read_text())["records"]
    assert len(records) == 6 and {r["dataset"] for r in records} == {"p"}
    assert all(
        r["lossless"] is None for r in records
    )  # samples are not compared at temp > 0
    assert json.loads(lines[-1])["rows"][0]["dataset"] == "p"


def test_bad_options_are_clean_errors(pair):
    target, draft = pair
    for extra, message in [
        (["--dataset", "gsm9k"], "Unknown dataset"),
        (["--dataset", "gsm8k", "--block-size", "1"], "Block sizes must be >= 2"),
        (["--dataset", "gsm8k", "--engine", "vllm"], "Unknown --engine"),
    ]:
        result = CliRunner().invoke(
            app,
            [
                "bench",
                "--model",
                str(target),
                "--draft",
                str(draft),
                "--max-samples",
                "1",
                "--max-tokens",
                "2",
                *extra,
            ],
        )
        assert result.exit_code == 2 and message in result.output, result.output
        assert "Traceback" not in result.output


def test_reference_engine_side_by_side(pair):
    target, draft = pair
    result, lines = _invoke(
        "--model",
        target,
        "--draft",
        draft,
        "--dataset",
        "humaneval",
        "--max-samples",
        1,
        "--max-tokens",
        6,
        "--engine",
        "reference",
    )
    assert result.exit_code == 0, result.output
    rows = json.loads(lines[-1])["rows"]
    # auto for this package, the drafter's size for both (the reference has no auto)
    assert [(r["engine"], r["block_size"]) for r in rows] == [
        ("dflash", "auto"),
        ("dflash", 8),
        ("reference", 8),
    ]


def _record(engine, bs, taus, tps, dataset="d", lossless=None):
    tokens = 1 + sum(taus) if taus else 11
    decode_s = (tokens - 1) / tps
    return bench.Record(
        dataset,
        "s",
        0,
        engine,
        bs,
        10,
        tokens,
        0.1,
        decode_s,
        tps,
        list(taus),
        lossless=lossless,
    )


def test_summary_numbers():
    records = [
        _record("baseline", 1, [], 10.0),
        _record("dflash", 4, [4, 4, 2], 30.0, lossless=True),
        _record("baseline", 1, [], 30.0),
        _record("dflash", 4, [1, 1], 30.0, lossless=False),
    ]
    records[3].first_mismatch = 5
    s = bench.summarize(records)
    (row,) = s["rows"]
    assert row["baseline_tps"] == pytest.approx(15.0)  # 1 / mean(1/10, 1/30)
    assert row["tps"] == pytest.approx(30.0) and row["speedup"] == pytest.approx(2.0)
    assert row["mean_tau"] == pytest.approx((10 / 3 + 1) / 2)
    assert row["tau_histogram"] == pytest.approx([0.4, 0.2, 0.0, 0.4])
    assert row["lossless_failures"] == 1 and s["lossless"] is False
    assert s["failures"][0]["first_mismatch"] == 5
    compact = bench.compact(s)
    assert compact["lossless"] is False and compact["rows"][0]["speedup"] == 2.0
    tally = bench.Tally()
    tally.add(records)
    assert tally.speedup() == (pytest.approx(2.0), 4)


def test_summary_by_source():
    """Per source: steps, tokens, their share, and how many proposals were taken;
    against our plain decoding when it ran."""
    run = _record("dflash", "auto", [1, 4, 2, 3], 30.0)
    run.sources, run.proposed, run.taken = (
        [None, "lookup", "draft", "lookup"],
        [0, 7, 3, 3],
        [0, 3, 1, 2],
    )
    records = [_record("baseline", 1, [], 10.0), _record("plain", 1, [], 12.0), run]
    rows = bench.summarize(records)["rows"]
    assert [r["engine"] for r in rows] == ["plain", "dflash"]
    row = rows[1]
    assert row["speedup_vs_plain"] == pytest.approx(2.5)
    assert row["sources"]["lookup"] == dict(
        steps=2, tokens=7, mean_tau=3.5, token_share=0.7, proposed=10, acceptance=0.5
    )
    assert row["sources"]["draft"]["acceptance"] == pytest.approx(1 / 3)
    assert row["sources"]["plain"]["acceptance"] is None


def test_plain_engine_code_edits_and_sources(pair, tmp_path):
    """--engine plain measures this package's plain decoding beside DFlash (lookup
    on by default with auto); the JSON says where each step's tokens came from."""
    target, draft = pair
    out = tmp_path / "edits.json"
    result, lines = _invoke(
        "--model", target, "--draft", draft, "--dataset", "code-edits",
        "--max-samples", 2, "--max-tokens", 24, "--engine", "plain", "--json", out,
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    flat = " ".join(result.output.split())  # Rich wraps lines at the terminal width
    assert "sources (code-edits, B=auto)" in flat
    assert "× our plain decoding" in flat
    last = json.loads(lines[-1])
    assert last["lossless"] is True
    assert [(r["engine"], r["speedup_vs_plain"] is None) for r in last["rows"]] == [
        ("plain", False),
        ("dflash", False),
    ]
    report = json.loads(out.read_text())
    plain = [r for r in report["records"] if r["engine"] == "plain"]
    assert len(plain) == 2 and all(set(r["sources"]) == {None} for r in plain)
    dflash = [r for r in report["records"] if r["engine"] == "dflash"]
    for r in dflash:
        assert len(r["sources"]) == len(r["accept_lengths"]) == len(r["taken"])
        assert set(r["sources"]) <= {None, "draft", "lookup", "splice"}
    sources = report["summary"]["rows"][1]["sources"]
    assert sum(s["tokens"] for s in sources.values()) == sum(
        sum(r["accept_lengths"]) for r in dflash
    )


def test_parse_block_sizes():
    assert bench.parse_block_sizes("16") == [16]
    assert bench.parse_block_sizes("4, 8,16,8") == [4, 8, 16]
    assert bench.parse_block_sizes(None) is None
    for bad in ("x", "1", "4,0"):
        with pytest.raises(ValueError, match="(?i)block"):
            bench.parse_block_sizes(bad)


def test_chat_template_and_thinking_switch(pair):
    from dflash_mlx import load

    _, tokenizer = load(str(pair[0]))
    messages = [{"role": "user", "content": "hi"}]
    ids = bench.chat_ids(tokenizer, messages, thinking=False)
    assert (
        tokenizer.decode(ids)
        == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    )
    with pytest.raises(ValueError, match="drop --thinking"):
        bench.chat_ids(tokenizer, messages, thinking=True)


def test_environment_names_the_blas(pair):
    from dflash_mlx import load

    model, _ = load(str(pair[0]))
    env = bench.environment(model, None, "m", "d")
    assert env["model_weights"] == "none (float32)"
    assert env["blas"].startswith(
        ("OpenBLAS", "MKL", "BLIS", "reference BLAS (slow)", "Accelerate/Metal")
    )
    import mlx.nn as nn

    nn.quantize(model, group_size=32, bits=4)
    assert bench.describe_weights(model) == "4-bit (group 32)"


def test_plot_writes_a_png(tmp_path):
    records = [
        _record("baseline", 1, [], 10.0),
        _record("dflash", 4, [4, 2], 20.0, lossless=True),
        _record("dflash", "auto", [3, 1, 5], 25.0, lossless=True),
    ]
    path = tmp_path / "bench.png"
    bench.write_plot(records, bench.summarize(records), path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_model_resolution(pair):
    assert resolve_models("a/b", "c/d") == ("a/b", "c/d")
    with pytest.raises(ValueError, match="pass --draft"):
        resolve_models(str(pair[0]), None)  # a bare folder has no known drafter
