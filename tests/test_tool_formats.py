"""Tool calls and reasoning of every family the registry serves, as its model writes
them, streamed a few characters at a time through the server's TextStream: mlx-lm's
parser where it has one (picked from the family's template as mlx-lm picks it), ours
for gpt-oss (harmony) and Llama 3.1 (bare JSON). A call that does not parse comes back
as text with a log line."""

import importlib
import json
import logging
from types import SimpleNamespace

import pytest
from mlx_lm.tokenizer_utils import _infer_tool_parser

from dflash_mlx.loading.registry import DRAFTERS
from dflash_mlx.serve.textstream import TextStream
from dflash_mlx.serve.toolformats import OutputFormat, output_format

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
            },
        },
    }
]
WEATHER = {"name": "get_weather", "arguments": {"city": "Paris"}}
THINK = ("<think>", "</think>")

# family -> (a template fragment mlx-lm reads, its thinking markers, a real-shaped
# answer: reasoning, then one call)
FAMILIES = {
    "qwen3": (
        '<tool_call>\n{"name": {{ tool_call.name }}',
        THINK,
        "<think>\nThe user wants the weather.\n</think>\n\n<tool_call>\n"
        '{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
    ),
    "qwen3_5": (  # Qwen3.5/3.6/3.8, Qwen3-Coder, Qwen3-Coder-Next: XML functions
        "<tool_call>\n<function={{ tool_call.name }}>",
        THINK,
        "<think>\nThe user wants the weather.\n</think>\n\n<tool_call>\n"
        "<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n"
        "</tool_call>",
    ),
    "gemma4": (
        "<|tool_call>call:{{ name }}<tool_call|>",
        ("<|channel>thought", "<channel|>"),
        "<|channel>thought\nThe user wants the weather.<channel|>"
        '<|tool_call>call:get_weather{city:<|"|>Paris<|"|>}<tool_call|>',
    ),
    "glm_moe_dsa": (  # GLM-5.1
        "<tool_call>{{ name }}<arg_key>{{ k }}</arg_key>",
        THINK,
        "<think>The user wants the weather.</think>"
        "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value>"
        "</tool_call>",
    ),
    "kimi_k25": (
        "<|tool_calls_section_begin|>",
        THINK,
        "<think>The user wants the weather.</think>"
        "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0"
        '<|tool_call_argument_begin|>{"city": "Paris"}<|tool_call_end|>'
        "<|tool_calls_section_end|>",
    ),
    "minimax": (
        "<minimax:tool_call>",
        THINK,
        "<think>\nThe user wants the weather.\n</think>\n\n<minimax:tool_call>\n"
        '<invoke name="get_weather">\n<parameter name="city">Paris</parameter>\n'
        "</invoke>\n</minimax:tool_call>",
    ),
    "gpt_oss": (
        "<|start|>assistant<|channel|>commentary to=functions.{{ name }}<|message|>",
        None,
        "<|channel|>analysis<|message|>The user wants the weather.<|end|>"
        "<|start|>assistant<|channel|>commentary to=functions.get_weather "
        '<|constrain|>json<|message|>{"city":"Paris"}<|call|>',
    ),
    "llama": (  # Llama 3.1: the whole answer is the call
        '<|python_tag|> {"name": function name, "parameters": dictionary}',
        None,
        '{"name": "get_weather", "parameters": {"city": "Paris"}}',
    ),
}
# families whose template this repo has not seen: mlx-lm's parser applies where their
# template names its markers
UNCHECKED = {"muse_glimmer"}


class Pieces:
    """A detokenizer whose tokens are indices into a list of text pieces."""

    def __init__(self, pieces):
        self.pieces, self.last_segment = pieces, ""

    def add_token(self, token):
        self.last_segment = self.pieces[token]

    def finalize(self):
        self.last_segment = ""


def tokenizer_for(template: str, think):
    """What mlx-lm's tokenizer loader would give this template (without the
    checkpoint): its inferred parser module and markers."""
    fake = SimpleNamespace(chat_template=template, get_vocab=dict)
    kind = _infer_tool_parser(fake)
    module = importlib.import_module(f"mlx_lm.tool_parsers.{kind}") if kind else None
    return SimpleNamespace(
        chat_template=template,
        tool_parser=module and module.parse_tool_call,
        tool_call_start=module and module.tool_call_start,
        tool_call_end=module and module.tool_call_end,
        has_tool_calling=module is not None,
        has_thinking=think is not None,
        think_start=think and think[0],
        think_end=think and think[1],
        response_transitions={},
        structural_markers=(),
    )


def stream(text: str, fmt: OutputFormat, tools=TOOLS, step: int = 3):
    """Everything the client is sent, with `text` fed `step` characters a token."""
    pieces = [text[i : i + step] for i in range(0, len(text), step)]
    tokenizer = SimpleNamespace(detokenizer=Pieces(pieces))
    out = TextStream(tokenizer, fmt, tools=tools)
    delta = out.feed(list(range(len(pieces))))
    return delta.extend(out.finish()), out


def test_every_served_family_has_a_case():
    families = {family for _, family in DRAFTERS.values()}
    # qwen3_moe/qwen3_next (Qwen3-Coder) and qwen3_5_moe write Qwen3.5's XML calls
    covered = set(FAMILIES) | {"qwen3_moe", "qwen3_next", "qwen3_5_moe"} | UNCHECKED
    assert families <= covered, families - covered


@pytest.mark.parametrize("family", sorted(FAMILIES))
@pytest.mark.parametrize("step", [1, 3, 17])
def test_a_call_and_its_reasoning_parse(family, step):
    template, think, text = FAMILIES[family]
    fmt = output_format(tokenizer_for(template, think))
    delta, out = stream(text, fmt, step=step)
    calls = [{"name": c["name"], "arguments": c["arguments"]} for c in delta.tool_calls]
    assert calls == [WEATHER]
    assert out.made_tool_call
    assert delta.content.strip() == ""  # no markup leaks into the answer
    if family != "llama":  # Llama 3.1 does not think
        assert delta.reasoning.strip() == "The user wants the weather."


def test_harmony_final_answer_and_a_call_addressed_in_the_header():
    fmt = output_format(tokenizer_for(FAMILIES["gpt_oss"][0], None))
    assert fmt.name == "harmony"
    delta, out = stream(
        "<|channel|>analysis<|message|>Easy.<|end|><|start|>assistant"
        "<|channel|>final<|message|>It is sunny.<|return|>",
        fmt,
    )
    assert (delta.reasoning, delta.content, out.made_tool_call) == (
        "Easy.",
        "It is sunny.",
        False,
    )
    delta, _ = stream(
        ' to=functions.get_weather<|channel|>commentary json<|message|>{"city": '
        '"Paris"}<|call|>',
        fmt,
    )
    assert [(c["name"], c["arguments"]) for c in delta.tool_calls] == [
        ("get_weather", {"city": "Paris"})
    ]


def test_llama_json_is_a_call_only_where_tools_were_declared():
    fmt = output_format(tokenizer_for(FAMILIES["llama"][0], None))
    assert fmt.name == "llama3-json"
    text = '{"name": "Ada", "parameters": {"born": 1815}}'
    delta, out = stream(text, fmt, tools=None)
    assert delta.content == text and not out.made_tool_call
    delta, _ = stream("<|python_tag|>" + FAMILIES["llama"][2], fmt)
    assert [c["name"] for c in delta.tool_calls] == ["get_weather"]


@pytest.mark.parametrize("family", ["qwen3", "gpt_oss", "llama"])
def test_a_malformed_call_is_sent_as_text_with_a_log_line(family, caplog):
    template, think, _ = FAMILIES[family]
    fmt = output_format(tokenizer_for(template, think))
    broken = {
        "qwen3": '<tool_call>\n{"name": "get_weather", "arguments": {"city": \n'
        "</tool_call>",
        "gpt_oss": "<|channel|>commentary to=functions.get_weather <|message|>{city"
        "<|call|>",
        "llama": '{"name": "get_weather", "parameters": {"city": "Pa',
    }[family]
    with caplog.at_level(logging.WARNING, logger="dflash_mlx.serve"):
        delta, out = stream(broken, fmt)
    assert delta.tool_calls == [] and not out.made_tool_call
    assert "get_weather" in delta.content  # what the model wrote, as text
    assert "does not parse" in caplog.text


def test_a_malformed_streamed_call_over_http_is_text_never_a_500(tmp_path, caplog):
    import httpx
    import scripted
    from serve_helpers import LiveServer, sse_events

    from dflash_mlx import load

    broken = '\n{"name": "get_weather", "arguments": {"city": \n'
    script = {**scripted.SCRIPT, "<tool_call>": broken, broken: "</tool_call>"}
    del script[scripted.CALL]
    phrases = [scripted.THINK, scripted.ANSWER, broken]
    target = scripted.make_scripted_target(tmp_path / "t", script, phrases)
    model, tokenizer = load(str(target))
    body = {
        "model": "tiny",
        "messages": [{"role": "user", "content": "Weather in Paris?"}],
        "tools": TOOLS,
        "stream": True,
        "max_tokens": 32,
        "chat_template_kwargs": {"enable_thinking": False},
    }
    with caplog.at_level(logging.WARNING, logger="dflash_mlx.serve"):
        with LiveServer(model, tokenizer, None) as s:
            with httpx.stream("POST", s.url + "/v1/chat/completions", json=body) as r:
                assert r.status_code == 200
                events = sse_events(r)
    chunks = [json.loads(data) for _, data in events if data != "[DONE]"]
    deltas = [c["choices"][0] for c in chunks if c["choices"]]
    text = "".join(d["delta"].get("content") or "" for d in deltas)
    assert '"name": "get_weather"' in text
    assert not any(d["delta"].get("tool_calls") for d in deltas)
    assert deltas[-1]["finish_reason"] == "stop"
    assert "does not parse" in caplog.text


def test_mlx_lm_parser_comes_first():
    # a template mlx-lm has a parser for keeps it, whatever else it names
    template = FAMILIES["qwen3"][0] + " <|channel|> <|message|> <|python_tag|>"
    fmt = output_format(tokenizer_for(template, THINK))
    assert fmt.name == "mlx-lm" and fmt.start == "<tool_call>"
