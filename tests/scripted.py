"""A tiny llama target whose greedy output follows a script, for server tests of tool
calls and thinking through the real engine.

Its weights are a bigram table: the embedding is the identity, every layer's output
projections are zero (so the residual stream keeps the current token's embedding), and
the LM head maps each token to a chosen successor. The tokenizer is byte-level with the
script's phrases as whole tokens and a Qwen-style template that mlx-lm recognises
(`json_tools` tool calls in `<tool_call>`, `<think>` blocks).
"""

import json
from pathlib import Path

import mlx.core as mx
from mlx.utils import tree_flatten, tree_map

VOCAB = 272
THINK = "Let me check."
ANSWER = "It is sunny."
CALL = '\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n'
PHRASES = [THINK, ANSWER, CALL]
SPECIALS = ["<|im_start|>", "<think>", "</think>", "<tool_call>", "</tool_call>"]

# the last prompt token decides the path: "\n" (thinking off) or "<think>" (on)
SCRIPT = {
    "\n": "<tool_call>",
    "<tool_call>": CALL,
    CALL: "</tool_call>",
    "</tool_call>": "<|im_end|>",
    "<think>": THINK,
    THINK: "</think>",
    "</think>": ANSWER,
    ANSWER: "<|im_end|>",
}

TEMPLATE = (
    "{%- if tools %}<|im_start|>system\nTools: {{ tools | tojson }}\nAnswer with "
    '<tool_call>{"name": ..., "arguments": ...}</tool_call><|im_end|>\n{%- endif %}'
    "{%- for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content or '' }}"
    "{%- for tool_call in m.tool_calls or [] %}"
    "{%- if tool_call.function %}{%- set tool_call = tool_call.function %}{%- endif %}"
    '<tool_call>\n{"name": "{{ tool_call.name }}", "arguments": '
    "{{ tool_call.arguments | tojson }}}\n</tool_call>{%- endfor %}<|im_end|>\n"
    "{%- endfor %}{%- if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is not defined or enable_thinking %}<think>{% endif %}"
    "{%- endif %}"
)


def _tokenizer(path: Path, phrases: list[str]):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tok = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(alphabet)}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(
        add_prefix_space=False, use_regex=False
    )
    tok.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=SPECIALS,
    )
    fast.add_tokens(phrases)
    fast.chat_template = TEMPLATE
    fast.save_pretrained(str(path))
    return fast


def make_scripted_target(
    path: Path, script: dict = SCRIPT, phrases: list[str] = PHRASES
) -> Path:
    """Write the scripted target (config, weights, tokenizer) to `path`: greedy
    decoding follows `script` (token -> next token), whose texts other than "\n" and
    the special tokens are the `phrases`."""
    from mlx_lm.utils import _get_classes

    path.mkdir(parents=True, exist_ok=True)
    fast = _tokenizer(path, phrases)
    ids = {t: fast.convert_tokens_to_ids(t) for t in [*script, *script.values()]}
    ids["\n"] = fast.encode("\n", add_special_tokens=False)[0]
    assert max(ids.values()) < VOCAB
    config = dict(
        model_type="llama",
        hidden_size=VOCAB,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        rms_norm_eps=1e-6,
        max_position_embeddings=4096,
        rope_theta=10000.0,
        vocab_size=VOCAB,
        tie_word_embeddings=False,
    )
    model_class, args_class = _get_classes(config)
    model = model_class(args_class.from_dict(config))
    model.update(tree_map(mx.zeros_like, model.parameters()))
    eos = fast.convert_tokens_to_ids("<|im_end|>")
    successor = [eos] * VOCAB
    for src, dst in script.items():
        successor[ids[src]] = ids[dst]
    head = mx.zeros((VOCAB, VOCAB)).at[mx.array(successor), mx.arange(VOCAB)].add(1.0)
    model.model.embed_tokens.weight = mx.eye(VOCAB)
    model.model.norm.weight = mx.ones((VOCAB,))
    for layer in model.model.layers:
        layer.input_layernorm.weight = mx.ones((VOCAB,))
        layer.post_attention_layernorm.weight = mx.ones((VOCAB,))
    model.lm_head.weight = head
    weights = dict(tree_flatten(model.parameters()))
    mx.save_safetensors(str(path / "model.safetensors"), weights)
    (path / "config.json").write_text(json.dumps(config, indent=2))
    return path
