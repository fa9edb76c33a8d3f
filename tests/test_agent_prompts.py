"""The long-context benchmark's agent-shaped prompts (bench/agent_prompts.py)."""

import re

import pytest

from dflash_mlx.bench.agent_prompts import KINDS, agent_prompt


def count(text: str) -> int:  # a tokenizer's stand-in: about 4 characters a token
    return len(text) // 4


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("tokens", [2048, 16384, 65536])
def test_prompts_reach_the_length_asked_for(kind, tokens):
    prompt = agent_prompt(count, tokens, kind)
    assert 0.97 * tokens <= count(prompt) <= tokens
    assert prompt.startswith("You are a coding agent")
    assert prompt.count("<tool_result tool=") == prompt.count("</tool_result>") > 2


def test_the_same_seed_gives_the_same_prompt_and_another_seed_another():
    assert agent_prompt(count, 4096, "edit") == agent_prompt(count, 4096, "edit")
    assert agent_prompt(count, 4096, "edit") != agent_prompt(count, 4096, "edit", 1)


@pytest.mark.parametrize("tokens", [2048, 32768])
def test_the_edit_request_names_a_file_and_function_the_prompt_holds(tokens):
    prompt = agent_prompt(count, tokens, "edit")
    request = prompt.rsplit("\n", 1)[-1]
    path, name = re.search(r"In (\S+), rename the function `(\w+)`", request).groups()
    read = re.search(
        rf'<tool_result tool="read_file" arg="{re.escape(path)}">\n(.*?)</tool_result>',
        prompt,
        re.S,
    )
    assert read and f"def {name}(" in read.group(1)


def test_the_prose_request_asks_for_no_code():
    prompt = agent_prompt(count, 2048, "prose")
    assert prompt.endswith("risks you see in changing them.")


def test_an_unknown_kind_is_refused():
    with pytest.raises(ValueError, match="choose from"):
        agent_prompt(count, 2048, "poem")
