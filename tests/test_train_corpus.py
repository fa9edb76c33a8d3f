"""A response corpus outlives runs: a second run generates only what it lacks."""

import gzip
import json

import pytest
import tiny

from dflash_mlx import load
from dflash_mlx.train.corpus import (
    corpus_meta,
    read_corpus,
    seed_cache,
    write_corpus,
)
from dflash_mlx.train.data import Prompt, read_samples, regenerate


@pytest.fixture(scope="module")
def target(models_dir):
    path = models_dir / "llama-corpus"
    if not path.exists():
        tiny.make_target(path, "llama")
    return load(str(path))


def _prompts(n):
    return [
        Prompt(f"p/{i}", [{"role": "user", "content": f"count {i}"}]) for i in range(n)
    ]


def test_a_second_run_takes_the_corpus_and_generates_the_rest(target, tmp_path):
    model, tok = target
    meta = corpus_meta("/some/where/model.gguf", 0.0, 8)
    assert meta["target"] == "model.gguf"  # machine paths never enter the corpus
    first = tmp_path / "run1" / "responses.jsonl"
    list(regenerate(model, tok, _prompts(3), first, max_tokens=8, batch_size=2))
    corpus = tmp_path / "corpus"
    assert write_corpus(corpus, meta, first) == 3
    second = tmp_path / "run2" / "responses.jsonl"
    assert seed_cache(corpus, meta, _prompts(5), tok, second) == 3
    progress = list(regenerate(model, tok, _prompts(5), second, max_tokens=8))
    assert progress[0].done == 3 and progress[-1].done == 5  # 2 new ones generated
    again = tmp_path / "run3" / "responses.jsonl"
    list(regenerate(model, tok, _prompts(5), again, max_tokens=8))
    fresh = {s.id: (s.prompt, s.response) for s in read_samples(again)}
    assert {s.id: (s.prompt, s.response) for s in read_samples(second)} == fresh
    assert write_corpus(corpus, meta, second) == 5
    stored = read_corpus(corpus)
    assert {k: v["response"] for k, v in stored.items()} == {
        k: v[1] for k, v in fresh.items()
    }
    with gzip.open(corpus / "responses.jsonl.gz", "rt") as f:
        assert all("prompt" not in json.loads(line) for line in f)  # ids only


def test_a_corpus_made_otherwise_is_refused(target, tmp_path):
    model, tok = target
    run = tmp_path / "run" / "responses.jsonl"
    list(regenerate(model, tok, _prompts(1), run, max_tokens=4))
    write_corpus(tmp_path / "c", corpus_meta("m.gguf", 0.0, 4), run)
    with pytest.raises(ValueError, match="made with other settings.*--corpus"):
        seed_cache(tmp_path / "c", corpus_meta("m.gguf", 0.7, 4), [], tok, run)


def test_no_generate_trains_on_the_stored_responses_only(target, tmp_path):
    from dflash_mlx.train.pipeline import TrainOptions, _responses

    model, tok = target
    run1 = tmp_path / "run1" / "responses.jsonl"
    list(regenerate(model, tok, _prompts(2), run1, max_tokens=8))
    opts = TrainOptions(target="m.gguf", out=tmp_path / "out", max_new_tokens=8,
                        corpus=tmp_path / "c", generate=False)  # fmt: skip
    write_corpus(opts.corpus, corpus_meta("m.gguf", 0.0, 8), run1)
    gen = _responses(opts, model, tok, _prompts(5), tmp_path / "out" / "data")
    progress = []
    try:
        while True:
            progress.append(next(gen))
    except StopIteration as stop:
        kept = stop.value
    assert [p.id for p in kept] == ["p/0", "p/1"]
    assert progress[-1].done == progress[-1].total == 2 and progress[-1].new_tokens == 0
