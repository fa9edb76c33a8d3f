"""Chat prompts without a session: templates, thinking, token-exact encoding."""

import pytest
import tiny

from dflash_mlx import load
from dflash_mlx.conversation import (
    Exchange,
    encode,
    opens_thinking,
    render,
    supports_thinking,
)

USER = [{"role": "user", "content": "2+2?"}]


@pytest.fixture(scope="module")
def byte_tok(tiny_pair):
    return load(str(tiny_pair("qwen3")[0]))[1]


@pytest.fixture(scope="module")
def qwen3_tok(models_dir):
    path = models_dir / "qwen3-real-tok"
    if not path.exists():
        tiny.make_target(path, "qwen3", vocab_size=151936, tokenizer="qwen3")
    return load(str(path))[1]


def test_render_with_the_template_a_system_prompt_and_raw(byte_tok):
    text = render(byte_tok, USER, system="Be brief.")
    assert text == (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n"
    )
    assert render(byte_tok, USER, system="S", raw=True) == "S\n\n2+2?"
    assert not supports_thinking(byte_tok)
    # a thinking request is ignored where the template has no switch
    assert render(byte_tok, USER, thinking=True) == render(byte_tok, USER)


def test_render_without_a_template():
    class NoTemplate:
        chat_template = None

    assert render(NoTemplate(), USER) == "User: 2+2?\n\nAssistant:"


def test_thinking_switch_and_template_keywords(qwen3_tok):
    assert supports_thinking(qwen3_tok)
    off = render(qwen3_tok, USER, thinking=False)
    on = render(qwen3_tok, USER, thinking=True)
    assert off.endswith("<think>\n\n</think>\n\n") and not opens_thinking(off)
    assert on.endswith("<|im_start|>assistant\n")
    tool = {
        "type": "function",
        "function": {"name": "add", "description": "Add", "parameters": {}},
    }
    assert '"name": "add"' in render(qwen3_tok, USER, tools=[tool])
    assert opens_thinking("<think>\nstill going") and not opens_thinking("no tags")


def test_encode_keeps_the_last_answers_ids(byte_tok):
    first = render(byte_tok, USER)
    ids = encode(byte_tok, first)
    assert ids == byte_tok.encode(first, add_special_tokens=False)
    # ids the model generated that re-tokenizing would not give back
    answer_ids = [ord("4"), ord("!")]
    before = Exchange(first + "4!", ids + answer_ids[::-1])
    follow = USER + [{"role": "assistant", "content": "4!"}, USER[0]]
    text = render(byte_tok, follow)
    assert text.startswith(before.text)
    got = encode(byte_tok, text, before)
    rest = byte_tok.encode(text[len(before.text) :], add_special_tokens=False)
    assert got == before.ids + rest
    assert got != encode(byte_tok, text)  # re-tokenizing would lose those ids
    # a prompt that does not continue the exchange is encoded afresh
    assert encode(byte_tok, "other", before) == byte_tok.encode(
        "other", add_special_tokens=False
    )
