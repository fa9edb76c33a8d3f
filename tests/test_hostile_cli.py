"""Hostile inputs through the real commands (generate, chat, bench, doctor): each
exits 2 (usage, before any model loads) or 1 (at run time), says how to fix it, and
never shows a traceback."""

import json

import pytest
from hostile import broken_folders
from typer.testing import CliRunner

from dflash_mlx.cli.main import app

NOWHERE = "/no/such/model"  # a usage error must be found before this fails to load


@pytest.fixture(scope="module")
def folders(tiny_pair, tmp_path_factory):
    t, d = tiny_pair("qwen3")
    return {"target": t, "draft": d} | broken_folders(
        tmp_path_factory.mktemp("broken"), t, d
    )


def flat(text: str) -> str:
    """Rich wraps long lines (a temporary path's length moves the breaks)."""
    return " ".join(text.split())


def invoke(*args, input=None):
    result = CliRunner().invoke(app, [str(a) for a in args], input=input)
    assert "Traceback" not in result.output, result.output
    assert not isinstance(result.exception, Exception) or isinstance(
        result.exception, SystemExit
    ), repr(result.exception)
    return result


USAGE = {  # generate options refused before loading (the model does not exist)
    "seed -1": (["--seed", "-1"], "seed must be between 0 and 2**64 - 1"),
    "temp inf": (["--temp", "inf"], "temperature must be a finite number"),
    "temp nan": (["--temp", "nan"], "temperature must be a finite number"),
    "temp -1": (["--temp", "-1"], "temperature must be >= 0 (0: greedy)"),
    "max tokens -5": (["-n", "-5"], "max_tokens must be positive, or -1"),
    "max tokens 0": (["-n", "0"], "max_tokens must be positive, or -1"),
    "block size 0": (["-b", "0"], "expected an integer >= 1 or 'auto'"),
    "top-p 2": (["--top-p", "2"], "--top-p"),
    "top-k -3": (["--top-k", "-3"], "--top-k"),
    "argv not UTF-8": (["-p", "caf\udce9"], "The prompt is not valid UTF-8"),
    "blank prompt": (["-p", "   "], "The prompt is empty"),
}


@pytest.mark.parametrize("case", list(USAGE))
def test_generate_usage_errors_exit_2_before_loading(case):
    extra, words = USAGE[case]
    args = ["generate", "-p", "hi", "-m", NOWHERE, *extra]
    r = invoke(*args)
    assert r.exit_code == 2 and words in r.output, r.output
    assert "neither an existing folder" not in r.output  # no load was tried


def test_generate_stdin_not_utf8_exits_2():
    r = invoke("generate", "-p", "-", "-m", NOWHERE, input=b"caf\xe9 au lait")
    assert r.exit_code == 2
    assert "not valid UTF-8 (byte 0xe9 at offset 3)" in r.stderr
    assert "iconv" in r.stderr


RUNTIME = {  # the model loads (or fails to): exit 1 with the loader's words
    "missing model": (NOWHERE, "neither an existing folder nor a Hugging Face"),
    "drafter as --model": ("draft", "--draft` on the command line"),
    "no tokenizer": ("no_tokenizer", "has no tokenizer files"),
    "truncated weights": ("truncated", "delete it and download it again"),
    "config lacks hidden_size": ("no_hidden_size", "'hidden_size'"),
}


@pytest.mark.parametrize("case", list(RUNTIME))
def test_generate_runtime_errors_exit_1(folders, case):
    name, words = RUNTIME[case]
    model = folders.get(name, name)
    r = invoke("generate", "-p", "hi", "-m", model, "-n", 2)
    assert r.exit_code == 1 and words in flat(r.stderr), r.output


def test_generate_drafter_with_block_size_0_exits_1(folders):
    r = invoke(
        "generate", "-p", "hi", "-m", folders["target"], "-d", folders["draft_block_0"]
    )
    assert r.exit_code == 1 and "its config.json has block_size 0" in r.stderr


def test_generate_too_long_prompt_says_shorten_not_reset(folders):
    r = invoke("generate", "-p", "x" * 5000, "-m", folders["target"])
    assert r.exit_code == 1 and "shorten the prompt" in r.stderr
    assert "/reset" not in r.stderr


def test_generate_block_size_above_the_drafters_is_capped_and_said(folders):
    args = ["-p", "hi", "-m", folders["target"], "-d", folders["draft"], "-n", 6]
    capped = invoke("generate", *args, "-b", 1000, "--json")
    exact = invoke("generate", *args, "-b", 8, "--json")
    assert capped.exit_code == 0, capped.output
    record = json.loads(capped.stdout)
    assert record["block_size"] == 8 and "above the drafter's 8" in record["note"]
    assert record["text"] == json.loads(exact.stdout)["text"]


@pytest.mark.parametrize(
    "extra, words",
    [
        (["-n", "0"], "max_tokens must be positive"),
        (["--temp", "inf"], "temperature must be a finite number"),
    ],
    ids=["max 0", "temp inf"],
)
def test_chat_usage_errors_exit_2_before_loading(extra, words):
    r = invoke("chat", "-m", NOWHERE, *extra, input="hi\n")
    assert r.exit_code == 2 and words in r.output
    assert "dflash-mlx chat" not in r.output  # no banner: it never started


def test_chat_commands_refuse_and_save_keeps_existing_files(folders, tmp_path):
    mine = tmp_path / "mine.md"
    mine.write_text("keep me")
    script = [
        "/temp nan",
        "/max -5",
        "/block 1000",
        f"/save {mine}",
        f"/save {tmp_path / 'new.json'}",
        "/exit",
    ]
    r = invoke(
        "chat",
        *("-m", folders["target"], "-d", folders["draft"], "-n", 4),
        input="\n".join(script) + "\n",
    )
    assert r.exit_code == 0, r.output
    said = flat(r.stdout)
    assert "Expected a finite number, e.g. /temp 0.7" in said
    assert "Max tokens must be positive, or -1" in said
    assert "Block size 8, the drafter's largest (1000 is above it)." in said
    assert f"/save! {mine} replaces it" in said
    assert mine.read_text() == "keep me"
    assert json.loads((tmp_path / "new.json").read_text())["messages"] == []


def _bench(folders, *extra):
    args = ["bench", "-d", "gsm8k", "-n", 1, "--max-tokens", 2]
    return invoke(
        *args, "--model", folders["target"], "--draft", folders["draft"], *extra
    )


def test_bench_refuses_an_unwritable_json_path_before_running(folders, tmp_path):
    (tmp_path / "a-file").write_text("")
    r = _bench(folders, "--json", tmp_path / "a-file" / "out.json")
    said = flat(r.output)
    assert r.exit_code == 2 and "--json" in said and "cannot be written" in said
    assert "loading target" not in r.output


def test_bench_refuses_a_folder_as_plot_path(folders, tmp_path):
    r = _bench(folders, "--plot", tmp_path)
    assert r.exit_code == 2 and "is a folder: give a file name" in flat(r.output)


@pytest.mark.parametrize(
    "extra, words",
    [
        (["--max-tokens", "0"], "--max-tokens must be at least 1"),
        (["--temp", "inf"], "--temp must be a finite number"),
        (["--seed", "-1"], "seed must be between 0 and 2**64 - 1"),
    ],
    ids=["max 0", "temp inf", "seed -1"],
)
def test_bench_usage_errors_exit_2(folders, extra, words):
    r = _bench(folders, *extra)
    assert r.exit_code == 2 and words in r.output, r.output


def test_bench_missing_model_exits_1(folders):
    r = invoke("bench", "-d", "gsm8k", "--model", NOWHERE, "--draft", folders["draft"])
    assert r.exit_code == 1 and "neither an existing folder" in flat(r.output)


def test_bench_json_written_atomically_with_plot_and_auto(folders, tmp_path):
    out = tmp_path / "r.json"
    out.write_text("old results")
    r = _bench(folders, "--json", out, "--plot", tmp_path / "p.png")
    assert r.exit_code == 0, r.output
    assert json.loads(out.read_text())["summary"]["lossless"] is True
    assert (tmp_path / "p.png").stat().st_size > 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.png", "r.json"]


@pytest.mark.parametrize("size", ["100000", "64", "-1", "5000"])
def test_doctor_matmul_size_out_of_range_exits_2(size):
    r = invoke("doctor", "--matmul-size", size)
    assert r.exit_code == 2 and "between 256 and 4096" in r.output
    assert "call overhead" in r.output
