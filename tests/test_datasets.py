"""Bundled benchmark prompt sets and custom JSONL prompt files."""

import json
import random

import pytest

from dflash_mlx import datasets as ds

SIZES = {"gsm8k": 1319, "math500": 500, "humaneval": 164, "mbpp": 257, "mt-bench": 80}
REASON = "\nPlease reason step by step, and put your final answer within \\boxed{}."


@pytest.mark.parametrize("name", ds.DATASETS)
def test_bundled_set_loads_whole(name):
    samples = ds.load_dataset(name)
    assert len(samples) == SIZES[name]
    assert len({s.id for s in samples}) == len(samples)
    turns = 2 if name == "mt-bench" else 1
    assert all(
        len(s.turns) == turns and all(t.strip() for t in s.turns) for s in samples
    )
    assert all(s.dataset == name for s in samples)


def test_formats_match_the_reference_benchmark():
    g = ds.load_dataset("gsm8k")
    first = next(s for s in g if s.id == "gsm8k/0")
    assert first.turns[0].startswith("Janet’s ducks lay 16 eggs per day.")
    assert first.turns[0].endswith("farmers' market?" + REASON)
    assert first.answer.endswith("#### 18")
    m = ds.load_dataset("math500")
    assert all(s.turns[0].endswith(REASON) for s in m)
    h = {s.id: s for s in ds.load_dataset("humaneval")}["HumanEval/0"]
    assert h.turns[0].startswith(
        "Write a solution to the following problem and make sure that "
        "it passes the tests:\n```python\nfrom typing import List\n"
    )
    assert h.turns[0].endswith("\n```")
    mb = {s.id: s for s in ds.load_dataset("mbpp")}
    assert set(map(int, mb)) <= set(range(11, 511)) and "2" not in mb
    assert (
        mb["11"].turns[0]
        == "Write a python function to remove first and last occurrence of a given "
        "character from the string."
    )
    mt = {s.id: s for s in ds.load_dataset("mt-bench")}["81"]
    assert mt.turns[0].startswith(
        "Compose an engaging travel blog post about a recent trip to Hawaii"
    )
    assert (
        mt.turns[1]
        == "Rewrite your previous response. Start every sentence with the letter A."
    )


def test_draw_is_the_reference_shuffle_and_seeded():
    whole = ds.bundled("humaneval")
    assert whole[0].id == "HumanEval/0"
    order = list(range(len(whole)))
    random.Random(42).shuffle(order)
    assert [s.id for s in ds.load_dataset("humaneval", 5)] == [
        whole[i].id for i in order[:5]
    ]
    assert ds.load_dataset("humaneval", 5, seed=42) == ds.load_dataset("humaneval", 5)
    assert ds.load_dataset("humaneval", 5, seed=7) != ds.load_dataset("humaneval", 5)
    assert len(ds.load_dataset("mt-bench", 1000)) == 80


def test_resolve_names_all_and_paths(tmp_path):
    assert ds.resolve("all") == list(ds.DATASETS)
    assert ds.resolve("gsm8k,mbpp,gsm8k") == ["gsm8k", "mbpp"]
    f = tmp_path / "mine.txt"
    f.write_text('"hi"\n')
    assert ds.resolve(f"{f}") == [str(f)]
    with pytest.raises(ValueError, match="Unknown dataset 'gsm9k'.*mt-bench"):
        ds.resolve("gsm9k")
    with pytest.raises(ValueError, match="No dataset"):
        ds.resolve(" , ")


def test_custom_jsonl(tmp_path):
    f = tmp_path / "prompts.jsonl"
    rows = [
        '"a plain string"',
        json.dumps({"prompt": "one turn", "id": "x1", "answer": "42"}),
        "",
        json.dumps({"turns": ["first", "second"]}),
    ]
    f.write_text("\n".join(rows) + "\n")
    samples = ds.load_dataset(str(f))
    assert sorted(s.turns for s in samples) == [
        ("a plain string",),
        ("first", "second"),
        ("one turn",),
    ]
    assert {s.dataset for s in samples} == {"prompts"}
    assert next(s for s in samples if s.id == "x1").answer == "42"


@pytest.mark.parametrize(
    "line, match",
    [
        ("{not json", "line 2 is not valid JSON"),
        ('{"text": "no prompt field"}', "line 2: each line must be"),
        ('{"turns": ["ok", ""]}', "line 2: each line must be"),
        ("17", "line 2: each line must be"),
    ],
)
def test_custom_jsonl_errors_name_the_line(tmp_path, line, match):
    f = tmp_path / "bad.jsonl"
    f.write_text('"fine"\n' + line + "\n")
    with pytest.raises(ValueError, match=match):
        ds.load_dataset(str(f))


def test_missing_or_empty_prompt_file(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        ds.load_jsonl(tmp_path / "nope.jsonl")
    (tmp_path / "empty.jsonl").write_text("\n\n")
    with pytest.raises(ValueError, match="no prompts"):
        ds.load_jsonl(tmp_path / "empty.jsonl")


def test_data_folder_is_small_licensed_and_has_no_training_split():
    files = {p.name: p.stat().st_size for p in ds.DATA_DIR.iterdir()}
    bench_files = [spec.file for spec in ds.BUNDLED.values()]
    assert sum(files[f] for f in bench_files) < 600_000
    assert not any("train" in f for f in bench_files)
    for licence in ("gsm8k", "math500", "humaneval", "mbpp", "mt_bench"):
        assert files.get(f"LICENSE.{licence}", 0) > 100
    assert "SOURCES.md" in files
    assert all(f.endswith(".jsonl.gz") for f in bench_files)


def test_code_train_prompts_are_not_the_benchmarks():
    from dflash_mlx.datasets import bundled
    from dflash_mlx.train.data import load_prompts

    prompts = {p.messages[0]["content"] for p in load_prompts("bundled:code-train")}
    assert len(prompts) == len(load_prompts("bundled:code-train")) > 1000  # distinct
    tests = {s.turns[0] for name in ("humaneval", "mbpp") for s in bundled(name)}
    assert not prompts & tests


def test_code_train_2_prompts_are_new_and_not_the_benchmarks():
    """Class-method prompts: distinct, none of code-train's, none a benchmark prompt,
    every id in the set's own namespace and both shapes present."""
    import gzip
    import json

    from dflash_mlx.datasets import DATA_DIR, bundled
    from dflash_mlx.train.data import load_prompts

    second = load_prompts("bundled:code-train-2")
    texts = [p.messages[0]["content"] for p in second]
    assert len(set(texts)) == len(texts) > 2000
    first = {p.messages[0]["content"] for p in load_prompts("bundled:code-train")}
    tests = {s.turns[0] for name in ("humaneval", "mbpp") for s in bundled(name)}
    assert not set(texts) & (first | tests)
    rows = [json.loads(line) for line in gzip.open(DATA_DIR / "train_code_2.jsonl.gz")]
    assert [r["prompt"] for r in rows] == texts
    assert {r["id"].split("/")[0] for r in rows} == {"code-train-2"}
    assert {r["id"].split("/")[1] for r in rows} == {"humaneval", "mbpp"}
    assert all("class " in r["prompt"] for r in rows if "/humaneval/" in r["id"])


def test_chat_train_prompts_are_not_mt_bench():
    """Distinct general-chat prompts in both sets, none shared and none of them an
    MT-Bench turn (and the bundled files are what examples/make_chat_prompts.py
    writes)."""
    import gzip
    import importlib.util
    import json
    from pathlib import Path

    from dflash_mlx.datasets import DATA_DIR, bundled
    from dflash_mlx.train.data import load_prompts

    sets = {
        name: [p.messages[0]["content"] for p in load_prompts(f"bundled:{name}")]
        for name in ("chat-train", "chat-train-2")
    }
    first, second = sets["chat-train"], sets["chat-train-2"]
    assert len(set(first)) == len(first) == 1200
    assert len(set(second)) == len(second) == 1200 and not set(first) & set(second)
    turns = {t for s in bundled("mt-bench") for t in s.turns}
    assert not (set(first) | set(second)) & turns
    script = Path(__file__).parents[1] / "examples" / "make_chat_prompts.py"
    spec = importlib.util.spec_from_file_location("make_chat_prompts", script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    for file, topics in (
        ("train_chat.jsonl.gz", module.TOPICS),
        ("train_chat_2.jsonl.gz", module.MORE_TOPICS),
    ):
        rows = [json.loads(line) for line in gzip.open(DATA_DIR / file)]
        expected = [r.format(t) for r in module.REQUESTS for t in topics]
        assert [r["prompt"] for r in rows] == expected


def test_code_edits_paste_stdlib_code_no_benchmark_or_training_prompt():
    """64 prompts, 16 per kind, each pasting a function that parses (the reformat's
    2-space indent and the fix's flipped operator included) from the stdlib packages
    the training sets skip; none is a benchmark or code-train prompt."""
    import ast
    import gzip
    import re

    from dflash_mlx.train.data import load_prompts

    samples = ds.load_dataset("code-edits")
    rows = [json.loads(line) for line in gzip.open(ds.DATA_DIR / "code_edits.jsonl.gz")]
    assert len(samples) == len(rows) == 64 and len({s.id for s in samples}) == 64
    kinds = [r["kind"] for r in rows]
    assert {k: kinds.count(k) for k in set(kinds)} == dict.fromkeys(
        ("rename", "types", "fix", "reformat"), 16
    )
    for row in rows:
        code = re.search(r"```python\n(.*?)\n```", row["prompt"], re.S)
        assert code and isinstance(ast.parse(code.group(1)).body[0], ast.FunctionDef)
        package = row["id"].split("/")[2].split(".")[0]
        assert package in ("idlelib", "lib2to3", "turtle", "turtledemo"), row["id"]
    texts = {s.turns[0] for s in samples}
    others = {s.turns[0] for name in ds.DATASETS for s in ds.bundled(name)}
    for name in ("code-train", "code-train-2"):
        others |= {p.messages[0]["content"] for p in load_prompts(f"bundled:{name}")}
    assert not texts & others
    assert "code-edits" in ds.resolve("code-edits,gsm8k")
    assert "code-edits" not in ds.resolve("all")
