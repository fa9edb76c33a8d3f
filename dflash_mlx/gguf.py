"""GGUF targets: llama, qwen2 and qwen3 files read with `mx.load` into mlx-lm models.

Quantized tensors (Q4_0, Q4_1, Q8_0) arrive from `mx.load` as MLX affine triplets (uint32
`weight`, `scales`, `biases`, group size 32); they load into quantized layers as they are, or
are dequantized with `dequantize=True` (faster on CPU). The tokenizer and chat template are
rebuilt from the file's metadata.
"""

import importlib
from pathlib import Path

import mlx.core as mx

ARCHITECTURES = ("llama", "qwen2", "qwen3")
GROUP_SIZE = 32
FIX_QUANT = (
    "Convert it to F16, Q8_0, Q4_0 or Q4_1 (llama.cpp's `llama-quantize`), "
    "or load the safetensors version of the model."
)

_TOP = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}
_LAYER = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}
_SUFFIX = {"weight": "weight", "bias": "bias", "scales": "scales", "biases": "biases"}

# Pre-tokenizer split patterns, by `tokenizer.ggml.pre` (as in the models' tokenizer.json).
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_SPLITS = {
    "llama-bpe": _LLAMA3_SPLIT,
    "llama3": _LLAMA3_SPLIT,
    "smaug-bpe": _LLAMA3_SPLIT,
    "qwen2": _QWEN2_SPLIT,
    "deepseek-r1-qwen": _QWEN2_SPLIT,
}
CONTROL, USER_DEFINED = 3, 4


def _value(v):
    if isinstance(v, mx.array):
        return v.item() if v.ndim == 0 else v.tolist()
    return v


def read_gguf(path) -> tuple[dict, dict]:
    """(tensors, metadata) of a GGUF file, with a fix-it ValueError when it cannot be read."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise ValueError(f"GGUF file '{path}' does not exist; check the path.")
    try:
        weights, metadata = mx.load(str(path), return_metadata=True)
    except Exception as e:
        raise ValueError(
            f"GGUF file '{path}' cannot be read by MLX ({e}). It may be corrupt, or "
            f"use a tensor type MLX does not read. {FIX_QUANT}"
        ) from e
    return weights, {k: _value(v) for k, v in metadata.items()}


def _rope_scaling(arch: str, md: dict, weights: dict, head_dim: int, theta: float):
    kind = md.get(f"{arch}.rope.scaling.type", "none")
    if "rope_freqs.weight" in weights:
        return _llama3_scaling(
            arch, md, weights.pop("rope_freqs.weight"), head_dim, theta
        )
    if kind == "none":
        return None
    factor = md.get(f"{arch}.rope.scaling.factor", 1.0)
    if kind == "linear":
        return {"type": "linear", "factor": factor}
    if kind == "yarn":
        orig = md.get(f"{arch}.rope.scaling.original_context_length")
        return {
            "type": "yarn",
            "factor": factor,
            "original_max_position_embeddings": orig,
        }
    raise ValueError(
        f"GGUF rope scaling '{kind}' is not supported here (linear, yarn and "
        "llama3 are); load the safetensors version of the model."
    )


def _llama3_scaling(arch, md, freqs, head_dim, theta):
    # llama.cpp stores Llama-3 rope scaling as per-frequency factors: find the settings.
    from mlx_lm.models.rope_utils import Llama3RoPE

    orig = md.get(f"{arch}.rope.scaling.original_context_length", 8192)
    base = theta ** (mx.arange(0, head_dim, 2) / head_dim)
    for factor in (8.0, 32.0, 16.0, 4.0, 2.0):
        cfg = {
            "rope_type": "llama3",
            "factor": factor,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": orig,
        }
        rope = Llama3RoPE(head_dim, base=theta, scaling_config=cfg)
        if mx.allclose(rope._freqs / base, freqs.astype(mx.float32), rtol=1e-3).item():
            return cfg
    raise ValueError(
        "GGUF rope_freqs do not match Llama-3 rope scaling; load the safetensors "
        "version of the model."
    )


def model_config(md: dict, weights: dict) -> dict:
    """The mlx-lm config (Hugging Face field names) described by the GGUF metadata."""
    arch = md.get("general.architecture")
    if arch not in ARCHITECTURES:
        raise ValueError(
            f"GGUF architecture '{arch}' is not supported; GGUF targets here: "
            f"{', '.join(ARCHITECTURES)}. Load the safetensors version instead."
        )

    def get(key, default=None):
        v = md.get(f"{arch}.{key}", default)
        if v is None:
            raise ValueError(
                f"GGUF metadata lacks '{arch}.{key}'; the file is incomplete."
            )
        return v

    heads = get("attention.head_count")
    kv_heads = get("attention.head_count_kv", heads)
    if isinstance(heads, list) or isinstance(kv_heads, list):
        raise ValueError(
            "GGUF files with per-layer head counts are not supported here."
        )
    hidden = get("embedding_length")
    head_dim = md.get(f"{arch}.attention.key_length", hidden // heads)
    theta = float(get("rope.freq_base", 10000.0))
    config = {
        "model_type": arch,
        "hidden_size": hidden,
        "num_hidden_layers": get("block_count"),
        "intermediate_size": get("feed_forward_length"),
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        "rms_norm_eps": float(get("attention.layer_norm_rms_epsilon")),
        "vocab_size": weights["token_embd.weight"].shape[0],
        "max_position_embeddings": get("context_length", 4096),
        "rope_theta": theta,
        "rope_scaling": _rope_scaling(arch, md, weights, head_dim, theta),
        "tie_word_embeddings": "output.weight" not in weights,
    }
    if arch == "llama":
        config["attention_bias"] = "blk.0.attn_q.bias" in weights
        config["mlp_bias"] = "blk.0.ffn_up.bias" in weights
    return config


def _mlx_name(name: str) -> str:
    module, _, suffix = name.rpartition(".")
    if suffix not in _SUFFIX:
        raise ValueError(f"GGUF tensor '{name}' is not a known weight.")
    if module in _TOP:
        return f"{_TOP[module]}.{suffix}"
    parts = module.split(".")
    if len(parts) == 3 and parts[0] == "blk" and parts[2] in _LAYER:
        return f"model.layers.{parts[1]}.{_LAYER[parts[2]]}.{suffix}"
    raise ValueError(
        f"GGUF tensor '{name}' has no counterpart in mlx-lm's model; this file "
        "is not a plain llama/qwen2/qwen3 model."
    )


def unpermute_rows(x: mx.array, n_heads: int) -> mx.array:
    """Undo llama.cpp's per-head Q/K row interleave; rows only, so packed rows work too."""
    rows = x.shape[0]
    return (
        x.reshape(n_heads, rows // n_heads // 2, 2, *x.shape[1:])
        .swapaxes(1, 2)
        .reshape(x.shape)
    )


def _bits(weight: mx.array, scales: mx.array) -> int:
    bits = weight.shape[-1] * 32 // (scales.shape[-1] * GROUP_SIZE)
    if bits not in (4, 8):
        raise ValueError(
            f"GGUF quantized tensor with {bits} bits is not supported. {FIX_QUANT}"
        )
    return bits


def convert_weights(
    weights: dict,
    config: dict,
    dequantize: bool = False,
    dtype: mx.Dtype | None = None,
) -> tuple[dict, dict]:
    """GGUF tensors -> (mlx-lm weights, {module path: bits} of modules left quantized)."""
    out, quantized = {}, {}
    for name, w in weights.items():
        out[_mlx_name(name)] = w
    if config["model_type"] == "llama":
        heads = {
            "q_proj": config["num_attention_heads"],
            "k_proj": config["num_key_value_heads"],
        }
        for k in out:
            proj = k.split(".")[-2]
            if proj in heads:
                out[k] = unpermute_rows(out[k], heads[proj])
    for k in [k for k in out if k.endswith(".scales")]:
        module = k[: -len(".scales")]
        w, s, b = out[f"{module}.weight"], out.pop(k), out.pop(f"{module}.biases")
        bits = _bits(w, s)
        if dequantize:
            if dtype is not None:
                s, b = s.astype(dtype), b.astype(dtype)
            out[f"{module}.weight"] = mx.dequantize(
                w, s, b, group_size=GROUP_SIZE, bits=bits
            )
        else:
            out[f"{module}.scales"], out[f"{module}.biases"] = s, b
            quantized[module] = bits
    if dtype is not None:
        out = {
            k: v.astype(dtype) if mx.issubdtype(v.dtype, mx.floating) else v
            for k, v in out.items()
        }
    return out, quantized


def build_model(config: dict, weights: dict, quantized: dict):
    """A normal mlx-lm model instance for `config`, with `weights` loaded."""
    import mlx.nn as nn

    module = importlib.import_module(f"mlx_lm.models.{config['model_type']}")
    model = module.Model(module.ModelArgs.from_dict(config))
    if quantized:
        nn.quantize(
            model,
            class_predicate=lambda p, m: (
                p in quantized and {"group_size": GROUP_SIZE, "bits": quantized[p]}
            ),
        )
    try:
        model.load_weights(list(weights.items()), strict=True)
    except ValueError as e:
        raise ValueError(
            f"GGUF weights do not fit the model its metadata describes ({e})."
        ) from e
    model.eval()
    mx.eval(model.parameters())
    return model


def build_tokenizer(md: dict):
    """An mlx-lm TokenizerWrapper rebuilt from the GGUF tokenizer metadata (BPE, byte-level)."""
    from mlx_lm.tokenizer_utils import BPEStreamingDetokenizer, TokenizerWrapper
    from tokenizers import (
        AddedToken,
        Regex,
        Tokenizer,
        decoders,
        models,
        pre_tokenizers,
        processors,
    )
    from transformers import PreTrainedTokenizerFast

    kind = md.get("tokenizer.ggml.model")
    if kind != "gpt2":
        raise ValueError(
            f"GGUF tokenizer model '{kind}' is not supported (byte-level BPE, "
            "'gpt2', is); load the safetensors version of the model."
        )
    tokens = md["tokenizer.ggml.tokens"]
    merges = [tuple(m.split(" ", 1)) for m in md.get("tokenizer.ggml.merges", [])]
    types = md.get("tokenizer.ggml.token_type") or [1] * len(tokens)
    pre = md.get("tokenizer.ggml.pre", "default")
    tok = Tokenizer(
        models.BPE(
            {t: i for i, t in enumerate(tokens)},
            merges,
            ignore_merges=pre in ("llama-bpe", "llama3"),
        )
    )
    byte_level = pre_tokenizers.ByteLevel(
        add_prefix_space=False, use_regex=pre not in _SPLITS
    )
    if pre in _SPLITS:
        split = pre_tokenizers.Split(Regex(_SPLITS[pre]), behavior="isolated")
        tok.pre_tokenizer = pre_tokenizers.Sequence([split, byte_level])
    elif pre == "smollm":
        digits = pre_tokenizers.Digits(individual_digits=True)
        tok.pre_tokenizer = pre_tokenizers.Sequence([digits, byte_level])
    else:
        tok.pre_tokenizer = byte_level
    tok.decoder = decoders.ByteLevel()
    tok.add_tokens(
        [
            AddedToken(tokens[i], special=t == CONTROL, normalized=False)
            for i, t in enumerate(types)
            if t in (CONTROL, USER_DEFINED)
        ]
    )

    def special(key):
        i = md.get(f"tokenizer.ggml.{key}_token_id")
        return (
            (i, tokens[i]) if i is not None and 0 <= i < len(tokens) else (None, None)
        )

    bos_id, bos = special("bos")
    if md.get("tokenizer.ggml.add_bos_token", False) and bos is not None:
        tok.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A",
            pair=f"{bos} $A {bos} $B",
            special_tokens=[(bos, bos_id)],
        )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=bos,
        eos_token=special("eos")[1],
        unk_token=special("unknown")[1],
        pad_token=special("padding")[1],
    )
    fast.chat_template = md.get("tokenizer.chat_template")
    eos_ids = [special(k)[0] for k in ("eos", "eot", "eom")]
    return TokenizerWrapper(
        fast,
        BPEStreamingDetokenizer,
        eos_token_ids=[i for i in eos_ids if i is not None],
    )


def load_gguf(path, dequantize: bool = False, dtype: mx.Dtype | None = None):
    """Load a llama/qwen2/qwen3 GGUF file as (mlx-lm model, TokenizerWrapper).

    `dequantize=True` turns quantized tensors into plain weights, usually faster on CPU.
    `dtype` is what floating-point weights (and quantization scales) become; by default
    float32 on CPU, where float16 arithmetic is slow, and the file's own dtypes on a GPU.
    """
    weights, md = read_gguf(path)
    config = model_config(md, weights)
    if dtype is None and mx.default_device() == mx.cpu:
        dtype = mx.float32
    weights, quantized = convert_weights(weights, config, dequantize, dtype)
    model = build_model(config, weights, quantized)
    model.name_or_path = str(path)
    return model, build_tokenizer(md)
