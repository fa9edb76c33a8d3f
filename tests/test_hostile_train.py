"""Hostile inputs to `dflash-mlx train` and its library: every setting is checked
before the target loads (exit 2), or right after it and before any data is generated
(exit 1), and a folder holding someone's model is never overwritten silently."""

import json
import shutil

import pytest
from typer.testing import CliRunner

from dflash_mlx.cli.main import app
from dflash_mlx.train import TrainConfig, TrainOptions, check, load_prompts

NOWHERE = "/no/such/model"


@pytest.fixture
def prompts(tmp_path):
    f = tmp_path / "prompts.jsonl"
    f.write_text(
        "".join(json.dumps({"prompt": f"Count to {i}."}) + "\n" for i in range(4))
    )
    return f


def train(out, prompts, *extra, target=NOWHERE):
    args = ["train", "--target", target, "--out", out, "--prompts", prompts, *extra]
    result = CliRunner().invoke(app, [str(a) for a in args])
    assert "Traceback" not in result.output, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    return result


def said(result) -> str:
    return " ".join(result.output.split())  # Rich wraps long lines


USAGE = {
    "batch size 0": (["--batch-size", "0"], "--batch-size must be an integer >= 1"),
    "steps -1": (["--steps", "-1"], "--steps must be an integer >= 0"),
    "epochs 0": (["--epochs", "0"], "--epochs must be > 0"),
    "lr nan": (["--lr", "nan"], "--lr must be a finite number"),
    "warmup 1.5": (["--warmup", "1.5"], "--warmup must be >= 0 and < 1"),
    "features disk": (["--features", "disk"], "--features must be auto, cache or fly"),
    "block size 1": (["--block-size", "1"], "--block-size must be an integer >= 2"),
    "draft layers 0": (
        ["--draft-layers", "0"],
        "--draft-layers must be an integer >= 1",
    ),
    "target layers text": (["--target-layers", "a,b"], "comma-separated layer numbers"),
    "max new tokens 0": (["--max-new-tokens", "0"], "--max-new-tokens must be"),
    "temperature inf": (["--temperature", "inf"], "--temperature must be a finite"),
    "seed -1": (["--seed", "-1"], "seed must be between 0 and 2**64 - 1"),
    "init-from nowhere": (["--init-from", "/nowhere"], "no model.safetensors or"),
}


@pytest.mark.parametrize("case", list(USAGE))
def test_bad_settings_exit_2_before_loading(tmp_path, prompts, case):
    extra, words = USAGE[case]
    r = train(tmp_path / "run", prompts, *extra)
    assert r.exit_code == 2 and words in said(r), r.output


@pytest.mark.parametrize(
    "spec, words",
    [("missing.jsonl", "does not exist"), ("bundled:nope", "bundled:gsm8k-train")],
)
def test_bad_prompt_sets_exit_2_before_loading(tmp_path, spec, words):
    r = train(tmp_path / "run", tmp_path / spec if "." in spec else spec)
    assert r.exit_code == 2 and words in said(r)


def test_out_holding_another_model_is_refused_unless_forced(
    tiny_pair, tmp_path, prompts
):
    _, d = tiny_pair("llama")
    theirs = shutil.copytree(d, tmp_path / "their-drafter")
    before = {f.name: f.read_bytes() for f in theirs.iterdir()}
    r = train(theirs, prompts)
    assert r.exit_code == 2
    assert "already holds config.json, model.safetensors" in said(r)
    assert "pass --force" in said(r)
    assert {f.name: f.read_bytes() for f in theirs.iterdir()} == before
    forced = TrainOptions(
        target=NOWHERE, out=theirs, prompts=[str(prompts)], force=True
    )
    assert len(check(forced)[0]) > 0  # --force lets the run start


def test_out_that_is_a_file_or_unwritable_exits_2(tmp_path, prompts):
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    r = train(a_file, prompts)
    assert r.exit_code == 2 and "is a file: give a folder" in said(r)
    r = train(a_file / "run", prompts)
    assert r.exit_code == 2 and "cannot be written" in said(r)


def test_a_run_folder_of_ours_is_resumed_not_refused(tmp_path, prompts):
    run = tmp_path / "run"
    (run / "data").mkdir(parents=True)
    (run / "data" / "meta.json").write_text("{}")
    (run / "config.json").write_text("{}")  # the drafter a previous run exported
    options = TrainOptions(target=NOWHERE, out=run, prompts=[str(prompts)])
    train_set, val_set = check(options)
    assert len(train_set) + len(val_set) == 4


@pytest.mark.parametrize(
    "extra, words",
    [
        (["--target-layers", "1,99"], "Target layer ids [99] are outside 0..3"),
        (["--mask-token-id", "100000"], "--mask-token-id 100000 is outside"),
    ],
    ids=["target layers", "mask token"],
)
def test_settings_needing_the_target_fail_before_any_data(
    tiny_pair, tmp_path, prompts, extra, words
):
    t, _ = tiny_pair("llama")
    r = train(tmp_path / "run", prompts, *extra, target=t)
    assert r.exit_code == 1 and words in said(r), r.output
    assert not (tmp_path / "run" / "data" / "responses.jsonl").exists()


def test_init_from_another_shape_fails_before_any_data(tiny_pair, tmp_path, prompts):
    t, _ = tiny_pair("llama")
    _, other = tiny_pair("qwen3")  # another target's drafter: other shapes
    r = train(tmp_path / "run", prompts, "--init-from", other, target=t)
    assert r.exit_code == 1 and "does not fit this drafter" in said(r), r.output
    assert not (tmp_path / "run" / "data" / "responses.jsonl").exists()


def test_config_and_options_refuse_nonsense_when_built(tmp_path):
    with pytest.raises(ValueError, match="--steps must be an integer >= 0"):
        TrainConfig(steps=-1)
    with pytest.raises(ValueError, match="--batch-size must be an integer >= 1"):
        TrainConfig(batch_size=0)
    with pytest.raises(ValueError, match="--features must be auto, cache or fly"):
        TrainOptions(target="t", out=tmp_path, features="disk")
    with pytest.raises(ValueError, match="--prompts needs at least one"):
        TrainOptions(target="t", out=tmp_path, prompts=[])


def test_prompt_lines_may_be_bare_json_strings_as_in_bench(tmp_path):
    f = tmp_path / "p.jsonl"
    f.write_text('"What is 2 + 2?"\n{"prompt": "And 3 + 3?"}\n')
    got = load_prompts(str(f))
    assert [p.messages[0]["content"] for p in got] == ["What is 2 + 2?", "And 3 + 3?"]
    f.write_text("[1, 2]\n")
    with pytest.raises(
        ValueError, match="each line must be a JSON string or an object"
    ):
        load_prompts(str(f))
