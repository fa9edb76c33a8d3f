"""Prompt sets, response regeneration by the target, the token-id cache and its resume."""

import json

import pytest

from dflash_mlx import load, stream_generate
from dflash_mlx.train.data import (
    Prompt,
    check_meta,
    encode_chat,
    load_prompts,
    read_samples,
    regenerate,
)


def test_bundled_sets_are_training_splits_only():
    gsm = load_prompts("bundled:gsm8k-train")
    assert len(gsm) == 7473
    assert gsm[0].messages[0]["content"].startswith("Natalia sold clips")
    assert gsm[0].messages[0]["content"].endswith("within \\boxed{}.")
    mbpp = load_prompts("bundled:mbpp-train")
    assert len(mbpp) == 170
    import gzip
    from importlib import resources

    path = resources.files("dflash_mlx") / "data" / "train_mbpp.jsonl.gz"
    with gzip.open(str(path), "rt") as f:
        ids = [json.loads(line)["task_id"] for line in f]
    assert not [i for i in ids if 11 <= i <= 510]


def test_prompt_file_and_errors(tmp_path):
    f = tmp_path / "p.jsonl"
    f.write_text(
        '{"prompt": "hi"}\n{"id": "x", "messages": [{"role": "user", "content": "yo"}]}\n'
    )
    ps = load_prompts(str(f))
    assert [p.id for p in ps] == ["p/0", "x"] and ps[1].messages[0]["content"] == "yo"
    with pytest.raises(ValueError, match="bundled:gsm8k-train"):
        load_prompts("bundled:nope")
    with pytest.raises(ValueError, match="does not exist"):
        load_prompts(str(tmp_path / "missing.jsonl"))
    (tmp_path / "bad.jsonl").write_text('{"foo": 1}\n')
    with pytest.raises(ValueError, match="'prompt'"):
        load_prompts(str(tmp_path / "bad.jsonl"))


@pytest.fixture(scope="module")
def target(tiny_pair):
    t, _ = tiny_pair("llama")
    return load(str(t))


def _prompts(n):
    return [
        Prompt(f"q{i}", [{"role": "user", "content": f"question number {i}"}])
        for i in range(n)
    ]


def test_regenerate_writes_target_greedy_responses_and_resumes(target, tmp_path):
    model, tok = target
    path = tmp_path / "responses.jsonl"
    events = list(
        regenerate(model, tok, _prompts(2), path, max_tokens=12, batch_size=2)
    )
    assert events[-1].done == 2 and events[-1].total == 2
    first = read_samples(path)
    assert [s.id for s in first] == ["q0", "q1"]
    for s in first:  # the cached response is what the target itself says, greedy
        assert s.prompt == encode_chat(tok, _prompts(2)[int(s.id[1:])].messages)
        plain = [
            t
            for r in stream_generate(model, None, tok, s.prompt, max_tokens=12)
            for t in r.tokens
        ]
        assert s.response == plain
    before = path.read_text()
    # resume: a larger prompt set only generates the missing prompts
    events = list(
        regenerate(model, tok, _prompts(4), path, max_tokens=12, batch_size=3)
    )
    assert events[0].done == 2 and events[-1].done == 4
    assert path.read_text().startswith(before)
    assert sorted(s.id for s in read_samples(path)) == ["q0", "q1", "q2", "q3"]
    # nothing left: no generation at all
    events = list(regenerate(model, tok, _prompts(4), path, max_tokens=12))
    assert len(events) == 1 and events[0].done == 4 and events[0].new_tokens == 0


def test_regenerate_refills_the_batch_as_answers_end(target, tmp_path):
    """More prompts than batch slots: every prompt still gets the target's own answer."""
    model, tok = target
    path = tmp_path / "responses.jsonl"
    events = list(
        regenerate(model, tok, _prompts(5), path, max_tokens=10, batch_size=2)
    )
    assert [e.done for e in events] == [0, 1, 2, 3, 4, 5]
    samples = read_samples(path)
    assert sorted(s.id for s in samples) == [f"q{i}" for i in range(5)]
    for s in samples:
        plain = [
            t
            for r in stream_generate(model, None, tok, s.prompt, max_tokens=10)
            for t in r.tokens
        ]
        assert s.response == plain


def test_torn_last_line_is_dropped_and_regenerated(target, tmp_path):
    model, tok = target
    path = tmp_path / "responses.jsonl"
    list(regenerate(model, tok, _prompts(1), path, max_tokens=6))
    path.write_text(
        path.read_text() + '{"id": "q1", "prompt": [1, 2'
    )  # interrupted write
    assert [s.id for s in read_samples(path)] == ["q0"]
    list(regenerate(model, tok, _prompts(2), path, max_tokens=6))
    assert [s.id for s in read_samples(path)] == ["q0", "q1"]
    assert all(json.loads(line) for line in path.read_text().splitlines())


def test_meta_mismatch_is_refused(tmp_path):
    check_meta(tmp_path / "meta.json", {"target": "a", "temperature": 0.0})
    check_meta(tmp_path / "meta.json", {"target": "a", "temperature": 0.0})
    with pytest.raises(ValueError, match="another --out"):
        check_meta(tmp_path / "meta.json", {"target": "a", "temperature": 1.0})
