"""A tiny llama target that answers like an agent's model: it thinks, calls a tool when
the prompt declares tools, and answers once the tool's result is back. For tool round
trips through the real engine, the server and real agent clients
(examples/clients_check.sh, and the suite's tool and client tests).

The tokenizer is Qwen3's own (examples/assets/qwen3), so prompts cost what they cost
on a Qwen model, with the script's phrases added as whole tokens. Two chat templates:

- "qwen3": Qwen3's own template: tools as `<tools>` JSON in the system prompt, calls
  as `<tool_call>` JSON (mlx-lm's `json_tools` parser), results in `<tool_response>`,
  system messages accepted anywhere, the model opens `<think>` itself;
- "qwen3_5": written like Qwen3.5's: the same `<tools>` block, calls in XML
  (`<function=...><parameter=...>`, mlx-lm's `qwen3_coder` parser), a system message
  anywhere but first raises "System message must be at the beginning.", and the
  prompt opens `<think>` when thinking is on.

The script: thinking on, `<think>` THINK `</think>`; then a tool call if the prompt
declares tools and holds no tool result yet, else ANSWER; then end of turn. So an
agent that runs the call and sends its result back gets ANSWER. With `then`, a second
call, the model makes that call instead of answering once a result is back (for agents
that end a task with a tool call, such as mini-swe-agent's submit command).

How the weights do it. Hidden size 32: every scripted token has its own dimension (any
other token shares dimension 0) and two dimensions are flags. Embeddings are one-hot.
In its one layer, attention head 0 scores 40 on `<tool_call>` tokens (present in the
system prompt iff tools are declared) and 0 elsewhere, and writes 1 into the first
flag when it finds one; head 1 does the same for `<tool_response>` into the second.
The query/key pair sits in the slowest RoPE pair and rope_theta is 1e12, so positions
do not matter. Everything else adds nothing, so the final hidden state is the current
token's one-hot plus the flags; the head maps each scripted token to its successor
(weight 20), while the two decision points (the end of the thinking block or of a
thinking-off prompt) weigh ANSWER at 10, which the flags turn into a call
(+15 for `<tool_call>`) unless a result is there (-15). The second call's token weighs
16 after `<tool_call>` and 8 more with a result, so it beats the first call (20) only
there; with `then` a result no longer takes the call back.
"""

import gzip
import json
import shutil
from pathlib import Path

import mlx.core as mx
import numpy as np
from mlx.utils import tree_flatten

ASSETS = Path(__file__).parent / "assets"
THINK = "Let me check."
ANSWER = "It is sunny."
CALL = ("get_weather", {"city": "Paris"})  # the default call: (name, arguments)
VOCAB = 151936  # Qwen3's embedding rows
HIDDEN, HEAD_DIM = 32, 8
FLAG_CALLS, FLAG_RESULTS = HIDDEN - 2, HIDDEN - 1
SURE, DECIDE, TOOLS_BONUS = 20.0, 10.0, 15.0
THEN_AFTER_CALL, THEN_RESULT = 16.0, 8.0  # the second call: after `<tool_call>`; result

QWEN35_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\n# Tools\n\nYou have access to the following "
    "functions:\n\n<tools>{%- for tool in tools %}\n{{ tool | tojson }}{%- endfor %}\n"
    "</tools>\n\nIf you choose to call a function ONLY reply in the following format "
    "with NO suffix:\n\n<tool_call>\n<function=example_function_name>\n"
    "<parameter=example_parameter_1>\nvalue_1\n</parameter>\n</function>\n</tool_call>"
    "{%- if messages[0].role == 'system' %}\n\n{{ messages[0].content }}{%- endif %}"
    "<|im_end|>\n"
    "{%- elif messages[0].role == 'system' %}<|im_start|>system\n"
    "{{ messages[0].content }}<|im_end|>\n{%- endif %}"
    "{%- for m in messages %}"
    "{%- if m.role == 'system' %}{%- if not loop.first %}"
    "{{ raise_exception('System message must be at the beginning.') }}{%- endif %}"
    "{%- elif m.role == 'user' %}<|im_start|>user\n{{ m.content }}<|im_end|>\n"
    "{%- elif m.role == 'assistant' %}<|im_start|>assistant\n{{ m.content or '' }}"
    "{%- for call in m.tool_calls or [] %}"
    "{%- if call.function %}{%- set call = call.function %}{%- endif %}"
    "<tool_call>\n<function={{ call.name }}>\n"
    "{%- for key, value in call.arguments.items() %}<parameter={{ key }}>\n"
    "{{ value if value is string else value | tojson }}\n</parameter>\n{%- endfor %}"
    "</function>\n</tool_call>{%- endfor %}<|im_end|>\n"
    "{%- elif m.role == 'tool' %}"
    "{%- if loop.first or loop.previtem.role != 'tool' %}<|im_start|>user{%- endif %}"
    "\n<tool_response>\n{{ m.content }}\n</tool_response>"
    "{%- if loop.last or loop.nextitem.role != 'tool' %}<|im_end|>\n{%- endif %}"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n"
    "{%- if enable_thinking is defined and not enable_thinking %}"
    "<think>\n\n</think>\n\n{%- else %}<think>\n{%- endif %}{%- endif %}"
)


def call_text(style: str, name: str, arguments: dict) -> str:
    """What the model writes between `<tool_call>` and `</tool_call>`."""
    if style == "qwen3":
        return "\n" + json.dumps({"name": name, "arguments": arguments}) + "\n"
    params = "".join(
        f"<parameter={k}>\n{v if isinstance(v, str) else json.dumps(v)}\n</parameter>\n"
        for k, v in arguments.items()
    )
    return f"\n<function={name}>\n{params}</function>\n"


def _tokenizer(path: Path, style: str, calls: list[str]):
    from transformers import AutoTokenizer

    base = path / "qwen3-base"
    base.mkdir(parents=True, exist_ok=True)
    with gzip.open(ASSETS / "qwen3" / "tokenizer.json.gz") as f:
        (base / "tokenizer.json").write_bytes(f.read())
    shutil.copy(ASSETS / "qwen3" / "tokenizer_config.json", base)
    tok = AutoTokenizer.from_pretrained(str(base))
    shutil.rmtree(base)
    tok.add_tokens([THINK, ANSWER, *calls])
    if style == "qwen3_5":
        tok.chat_template = QWEN35_TEMPLATE
    tok.save_pretrained(str(path))
    return tok


def _script(tok, style: str, call: str, then: str | None) -> tuple[dict, dict]:
    """(token -> (successor, weight), token ids by name)."""
    ids = {
        name: tok.convert_tokens_to_ids(name)
        for name in ("<think>", "</think>", "<tool_call>", "</tool_call>")
    }
    ids.update(
        {
            "result": tok.convert_tokens_to_ids("<tool_response>"),
            "eos": tok.convert_tokens_to_ids("<|im_end|>"),
            "think": tok.convert_tokens_to_ids(THINK),
            "answer": tok.convert_tokens_to_ids(ANSWER),
            "call": tok.convert_tokens_to_ids(call),
            "\n": tok.encode("\n")[0],  # a thinking-on prompt's last token
            "\n\n": tok.encode("\n\n")[0],  # a thinking-off prompt's last token
        }
    )
    opened = style == "qwen3_5"  # the prompt already opened <think>
    script = {
        ids["\n"]: (ids["think"] if opened else ids["<think>"], SURE),
        ids["<think>"]: (ids["think"], SURE),
        ids["think"]: (ids["</think>"], SURE),
        ids["</think>"]: (ids["answer"], DECIDE),
        ids["\n\n"]: (ids["answer"], DECIDE),
        ids["<tool_call>"]: (ids["call"], SURE),
        ids["call"]: (ids["</tool_call>"], SURE),
        ids["</tool_call>"]: (ids["eos"], SURE),
        ids["answer"]: (ids["eos"], SURE),
    }
    if then is not None:
        ids["then"] = tok.convert_tokens_to_ids(then)
        script[ids["then"]] = (ids["</tool_call>"], SURE)
    return script, ids


def _attention(roles: dict, ids: dict) -> dict:
    """The attention's projections: head 0 flags `<tool_call>`, head 1
    `<tool_response>`."""
    scale = HIDDEN**-0.5  # the input norm turns a one-hot row into sqrt(HIDDEN)
    c = (40.0 * HEAD_DIM**0.5) ** 0.5  # a score of 40 on the keyed token
    pair = HEAD_DIM // 2 - 1  # the slowest RoPE pair
    wq, wk, wv = (np.zeros((2 * HEAD_DIM, HIDDEN), np.float32) for _ in range(3))
    wo = np.zeros((HIDDEN, 2 * HEAD_DIM), np.float32)
    for head, token, flag in (
        (0, "<tool_call>", FLAG_CALLS),
        (1, "result", FLAG_RESULTS),
    ):
        wq[head * HEAD_DIM + pair, :] = c * scale
        wk[head * HEAD_DIM + pair, roles[ids[token]]] = c * scale
        wv[head * HEAD_DIM, roles[ids[token]]] = scale
        wo[flag, head * HEAD_DIM] = 1.0
    return {"q_proj": wq, "k_proj": wk, "v_proj": wv, "o_proj": wo}


def make_scripted_target(
    path: Path, style: str = "qwen3", call=CALL, context: int = 65536, then=None
) -> Path:
    """Write the scripted target (config, weights, tokenizer) to `path`; `call` is the
    tool call it makes, as (name, arguments), and `then` the one it makes once a
    result is back (None: it answers ANSWER)."""
    from mlx_lm.utils import _get_classes

    if style not in ("qwen3", "qwen3_5"):
        raise ValueError(f"style must be 'qwen3' or 'qwen3_5', got {style!r}.")
    path.mkdir(parents=True, exist_ok=True)
    text = call_text(style, *call)
    then_text = None if then is None else call_text(style, *then)
    tok = _tokenizer(path, style, [text] + ([then_text] if then_text else []))
    script, ids = _script(tok, style, text, then_text)
    roles = {t: i + 1 for i, t in enumerate(sorted({*script, ids["result"]}))}
    assert len(roles) < FLAG_CALLS and len(tok) <= VOCAB
    config = dict(
        model_type="llama",
        hidden_size=HIDDEN,
        intermediate_size=16,
        num_hidden_layers=1,  # one layer, two heads: long agent prompts stay cheap
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=HEAD_DIM,
        rms_norm_eps=1e-6,
        max_position_embeddings=context,
        rope_theta=1e12,
        vocab_size=VOCAB,
        tie_word_embeddings=False,
        eos_token_id=ids["eos"],
    )
    embed = np.zeros((VOCAB, HIDDEN), np.float32)
    embed[:, 0] = 1.0
    for token, role in roles.items():
        embed[token] = np.eye(HIDDEN, dtype=np.float32)[role]
    head = np.zeros((VOCAB, HIDDEN), np.float32)
    head[ids["eos"], 0] = SURE  # any other token: end of turn
    for src, (dst, weight) in script.items():
        head[dst, roles[src]] = weight
    head[ids["<tool_call>"], FLAG_CALLS] = TOOLS_BONUS
    if then is None:
        head[ids["<tool_call>"], FLAG_RESULTS] = -TOOLS_BONUS
    else:
        head[ids["then"], roles[ids["<tool_call>"]]] = THEN_AFTER_CALL
        head[ids["then"], FLAG_RESULTS] = THEN_RESULT
    model_class, args_class = _get_classes(config)
    model = model_class(args_class.from_dict(config))
    weights = {k: mx.zeros_like(v) for k, v in tree_flatten(model.parameters())}
    for name, w in _attention(roles, ids).items():
        weights[f"model.layers.0.self_attn.{name}.weight"] = mx.array(w)
    for name in weights:
        if name.endswith("norm.weight"):
            weights[name] = mx.ones_like(weights[name])
    weights["model.embed_tokens.weight"] = mx.array(embed)
    weights["lm_head.weight"] = mx.array(head)
    mx.save_safetensors(str(path / "model.safetensors"), weights)
    (path / "config.json").write_text(json.dumps(config, indent=2))
    return path
