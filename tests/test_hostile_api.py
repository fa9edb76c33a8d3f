"""Hostile inputs through the Python API: each is refused with a ValueError whose
words say how to fix it (or, where a user would expect it, capped with one warning)."""

import math
import re
import warnings

import mlx.core as mx
import numpy as np
import pytest
from hostile import broken_folders

from dflash_mlx import (
    generate,
    load,
    load_draft,
    make_prompt_cache,
    stream_generate,
)
from dflash_mlx.chat import ChatSession, Settings

VOCAB = 272  # tiny.BYTE_VOCAB


@pytest.fixture(scope="module")
def pair(tiny_pair):
    t, d = tiny_pair("qwen3")
    model, tokenizer = load(str(t))
    return model, tokenizer, load_draft(str(d), target=model)


@pytest.fixture(scope="module")
def folders(tiny_pair, tmp_path_factory):
    t, d = tiny_pair("qwen3")
    return {"target": t, "draft": d} | broken_folders(
        tmp_path_factory.mktemp("broken"), t, d
    )


def run(pair, prompt=(5, 6, 7), **kw):
    model, tokenizer, draft = pair
    kw.setdefault("max_tokens", 4)
    return list(stream_generate(model, draft, tokenizer, prompt, **kw))


GENERATION_CASES = {
    "id above the vocabulary": (dict(prompt=[10**6, 5, 6]), "outside the target's"),
    "negative id": (dict(prompt=[-1, 5]), "vocabulary (0..271)"),
    "2-D prompt": (dict(prompt=mx.array([[5, 6], [7, 8]])), "shape (2, 2)"),
    "float ids": (dict(prompt=[5.7, 6.2]), "must be integers, got 5.7"),
    "float array": (dict(prompt=mx.array([5.0, 6.0])), "array of float32"),
    "nested lists": (dict(prompt=[[5, 6]]), "pass a flat list of ints"),
    "empty ids": (dict(prompt=[]), "The prompt is empty"),
    "empty text": (dict(prompt=""), "The prompt is empty"),
    "not UTF-8 text": (dict(prompt="caf\udce9"), "not valid UTF-8"),
    "bool ids": (dict(prompt=[True, 5]), "must be integers"),
    "max_tokens -5": (dict(max_tokens=-5), "positive, or -1 for no limit"),
    "max_tokens 0": (dict(max_tokens=0), "positive, or -1"),
    "max_tokens 2.5": (dict(max_tokens=2.5), "must be an integer"),
    "temperature nan": (dict(temperature=math.nan), "temperature must be a finite"),
    "temperature inf": (dict(temperature=math.inf), "temperature must be a finite"),
    "temperature -1": (dict(temperature=-1.0), "temperature must be >= 0"),
    "top_p 1.5": (dict(top_p=1.5), "top_p must be in [0, 1]"),
    "top_p nan": (dict(top_p=math.nan), "top_p must be a finite"),
    "min_p nan": (dict(min_p=math.nan), "min_p must be a finite"),
    "top_k -1": (dict(top_k=-1), "top_k must be >= 0"),
    "top_k 2.5": (dict(top_k=2.5), "top_k must be an integer"),
    "block_size 0": (dict(block_size=0), "positive integer or 'auto'"),
    "block_size text": (dict(block_size="big"), "positive integer or 'auto'"),
    "seed -1": (dict(seed=-1), "seed must be between 0 and 2**64 - 1"),
    "seed 2**64": (dict(seed=2**64), "non-negative seed"),
    "logprobs -1": (dict(logprobs=-1), "between 0 (none) and the vocabulary"),
    "logprobs above vocab": (dict(logprobs=VOCAB + 1), "vocabulary size 272"),
    "prefill step 0": (dict(prefill_step_size=0), "prefill_step_size must be"),
}


@pytest.mark.parametrize("case", list(GENERATION_CASES))
def test_stream_generate_refuses(pair, case):
    kwargs, words = GENERATION_CASES[case]
    with pytest.raises(ValueError) as e:
        run(pair, **kwargs)
    assert words in str(e.value)


def test_generate_blocks_checks_the_same_inputs(pair):
    from dflash_mlx.engine.loop import generate_blocks
    from dflash_mlx.models.target import Target
    from dflash_mlx.sampling import SamplingParams

    model, _, draft = pair
    target = Target(model, draft.args.target_layer_ids)
    cache = make_prompt_cache(target, draft)
    for prompt, max_tokens, words in [
        ([10**6], 4, "outside the target's vocabulary"),
        ([5], -7, "positive, or -1"),
    ]:
        blocks = generate_blocks(
            target, draft, prompt, cache, SamplingParams(), 4, max_tokens
        )
        with pytest.raises(ValueError, match=re.escape(words)):
            next(blocks)
    assert not cache.in_use  # a refused call never claimed the cache


def test_block_size_far_above_the_drafters_is_capped_with_one_warning(pair):
    plain_b8 = run(pair, block_size=8, max_tokens=12)
    with pytest.warns(UserWarning, match="above the drafter's 8: using 8") as seen:
        huge = run(pair, block_size=10**6, max_tokens=12)
    assert len(seen) == 1
    assert [r.tokens for r in huge] == [r.tokens for r in plain_b8]
    assert {r.block_size for r in huge[1:]} <= set(range(1, 9))


def test_one_prompt_row_and_numpy_ids_are_accepted(pair):
    want = [r.tokens for r in run(pair, prompt=[5, 6, 7])]
    for prompt in (mx.array([[5, 6, 7]]), np.array([5, 6, 7]), (5, 6, 7)):
        assert [r.tokens for r in run(pair, prompt=prompt)] == want


def test_generate_is_the_function(pair):
    import dflash_mlx.generate  # noqa: F401  (the submodule of the same name)

    model, tokenizer, draft = pair
    text = generate(model, draft, tokenizer, [5, 6, 7], max_tokens=4)
    assert isinstance(text, str) and callable(generate)


def test_a_prompt_cache_shared_by_two_live_generations(pair):
    model, tokenizer, draft = pair
    cache = make_prompt_cache(model, draft)
    first = stream_generate(model, draft, tokenizer, [5, 6], prompt_cache=cache)
    next(first)
    with pytest.raises(ValueError, match="in use by another generation"):
        next(stream_generate(model, draft, tokenizer, [5, 7], prompt_cache=cache))
    first.close()


LOAD_CASES = {
    "no such folder": ("/no/such/model", "neither an existing folder nor"),
    "not a name": (123, "must be a folder path or a Hugging Face repo id"),
    "a drafter as target": ("draft", "is a DFlash drafter, not a target model"),
    "no tokenizer files": ("no_tokenizer", "has no tokenizer files"),
    "half the weights": ("truncated", "the file is corrupt or incomplete"),
    "garbage weights": ("garbage", "cannot be read (no safetensors header)"),
    "config lacks a field": ("no_hidden_size", "lacks a field its model needs"),
}


@pytest.mark.parametrize("case", list(LOAD_CASES))
def test_load_refuses(folders, case):
    name, words = LOAD_CASES[case]
    spec = str(folders[name]) if name in folders else name
    with pytest.raises(ValueError) as e:
        load(spec)
    assert words in str(e.value)


@pytest.mark.parametrize(
    "kwargs, words",
    [
        (dict(bits=7), "bits must be one of 2, 3, 4, 5, 6, 8"),
        (dict(group_size=48), "group_size must be 32, 64 or 128"),
        (dict(sliding_window_size=0), "sliding_window_size must be a positive"),
    ],
    ids=["bits", "group size", "window"],
)
def test_load_draft_refuses_options(folders, kwargs, words):
    with pytest.raises(ValueError, match=re.escape(words)):
        load_draft(str(folders["draft"]), **kwargs)


def test_load_draft_refuses_a_zero_block_size_config(folders):
    with pytest.raises(ValueError) as e:
        load_draft(str(folders["draft_block_0"]))
    assert "its config.json has block_size 0" in str(e.value)
    assert "fix block_size in its config.json" in str(e.value)


@pytest.mark.parametrize(
    "kwargs, words",
    [
        (dict(max_tokens=0), "positive, or -1"),
        (dict(temperature=math.inf), "finite"),
        (dict(top_p=-0.1), "top_p must be in [0, 1]"),
        (dict(block_size=0), "positive integer"),
    ],
    ids=["max 0", "temp inf", "top_p", "block 0"],
)
def test_chat_settings_refuse_nonsense_when_built(kwargs, words):
    with pytest.raises(ValueError, match=re.escape(words)):
        Settings(**kwargs)


def _session(pair):
    model, tokenizer, draft = pair
    return ChatSession(model, tokenizer, draft, settings=Settings(max_tokens=4))


@pytest.mark.parametrize(
    "line, words",
    [
        ("/temp nan", "Expected a finite number"),
        ("/temp -1", "Temperature must be >= 0"),
        ("/max -5", "Max tokens must be positive, or -1"),
        ("/block 0", "Block size must be >= 1"),
        ("/save", "Usage: /save chat.md"),
    ],
)
def test_chat_commands_refuse(pair, line, words):
    with pytest.raises(ValueError, match=re.escape(words)):
        _session(pair).command(line)


def test_chat_block_size_above_the_drafters_is_capped(pair):
    s = _session(pair)
    _, message = s.command("/block 1000")
    assert message == "Block size 8, the drafter's largest (1000 is above it)."
    assert s.settings.block_size == 8


def test_chat_save_never_overwrites_without_the_bang(pair, tmp_path):
    s = _session(pair)
    mine = tmp_path / "notes.md"
    mine.write_text("my own notes")
    with pytest.raises(ValueError) as e:
        s.command(f"/save {mine}")
    assert f"/save! {mine} replaces it" in str(e.value)
    assert mine.read_text() == "my own notes"
    _, message = s.command(f"/save! {mine}")
    assert message.startswith("Saved 0 messages") and "# Chat with" in mine.read_text()
    assert [p.name for p in tmp_path.iterdir()] == ["notes.md"]  # no temp file left


def test_chat_message_not_utf8_and_too_long_prompts(pair):
    s = _session(pair)
    with pytest.raises(ValueError, match="This message is not valid UTF-8"):
        s.stream("caf\udce9")
    with pytest.raises(ValueError) as e:
        s.stream("x" * 5000)
    assert "shorten the prompt" in str(e.value) and "/reset" not in str(e.value)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a normal turn warns about nothing
        list(s.stream("hi"))
    with pytest.raises(ValueError, match="/reset the conversation"):
        s.stream("x" * 5000)
