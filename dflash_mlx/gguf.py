"""GGUF targets: llama, qwen2, qwen3 and qwen3moe files loaded into mlx-lm's own models.

Files whose tensors are all F32/F16/Q4_0/Q4_1/Q8_0 are read by `mx.load`; any other type
(K-quants, IQ types, BF16, MXFP4, ...) is memory-mapped and dequantized tensor by tensor
with llama.cpp's `gguf` package, so peak memory stays near the loaded model's size. The
model is float (float32 on CPU) unless `quantize=4|8` asks for MLX affine quantization,
done per tensor with the same choices as mlx-lm's `quantize_model`.
"""

import importlib

import mlx.core as mx

from .gguf_file import MLX_NATIVE, GGUFHeader, read_header, to_numpy
from .gguf_tokenizer import build_tokenizer

# GGUF `general.architecture` -> mlx-lm model_type.
ARCHITECTURES = {
    "llama": "llama",
    "qwen2": "qwen2",
    "qwen3": "qwen3",
    "qwen3moe": "qwen3_moe",
}
# Supported target families whose llama.cpp conversion rewrites tensors beyond renaming.
REFUSED = {
    "qwen35": "qwen3_5",
    "qwen35moe": "qwen3_5_moe",
    "qwen3next": "qwen3_next",
    "gemma4": "gemma4",
    "gpt-oss": "gpt_oss",
    "deepseek2": "deepseek_v3 / kimi_k25",
    "minimax-m2": "minimax",
}
NATIVE_BITS = {"Q4_0": 4, "Q4_1": 4, "Q8_0": 8}
NATIVE_GROUP = 32
FIX_ARCH = "Load the model's safetensors (or mlx-community MLX) repo instead."

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
    "ffn_gate_inp": "mlp.gate",
    "ffn_gate_exps": "mlp.switch_mlp.gate_proj",
    "ffn_up_exps": "mlp.switch_mlp.up_proj",
    "ffn_down_exps": "mlp.switch_mlp.down_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}
_SUFFIXES = ("weight", "bias")


def check_architecture(md: dict) -> str:
    """The mlx-lm model_type of a GGUF file, or a ValueError that says what to do."""
    arch = md.get("general.architecture")
    if arch in ARCHITECTURES:
        return ARCHITECTURES[arch]
    if arch in REFUSED:
        raise ValueError(
            f"GGUF architecture '{arch}' (mlx-lm '{REFUSED[arch]}', a supported DFlash "
            "target) is not read from GGUF here: llama.cpp rewrites its tensors beyond "
            f"renaming. {FIX_ARCH}"
        )
    raise ValueError(
        f"GGUF architecture '{arch}' is not a DFlash target family; GGUF targets here: "
        f"{', '.join(ARCHITECTURES)}. {FIX_ARCH}"
    )


def _rope_scaling(arch: str, header: GGUFHeader, head_dim: int, theta: float):
    md = header.metadata
    if "rope_freqs.weight" in header.tensors:
        freqs = to_numpy(header.path, header.tensors["rope_freqs.weight"])
        return _llama3_scaling(arch, md, mx.array(freqs), head_dim, theta)
    kind = md.get(f"{arch}.rope.scaling.type", "none")
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


def model_config(header: GGUFHeader) -> dict:
    """The mlx-lm config (Hugging Face field names) that the GGUF header describes."""
    md, tensors = header.metadata, header.tensors
    model_type = check_architecture(md)
    arch = md["general.architecture"]

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
    if "token_embd.weight" not in tensors:
        raise ValueError("GGUF file has no token_embd.weight; the file is incomplete.")
    hidden = get("embedding_length")
    head_dim = md.get(f"{arch}.attention.key_length", hidden // heads)
    theta = float(get("rope.freq_base", 10000.0))
    config = {
        "model_type": model_type,
        "hidden_size": hidden,
        "num_hidden_layers": get("block_count"),
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        "rms_norm_eps": float(get("attention.layer_norm_rms_epsilon")),
        "vocab_size": tensors["token_embd.weight"].shape[0],
        "max_position_embeddings": get("context_length", 4096),
        "rope_theta": theta,
        "rope_scaling": _rope_scaling(arch, header, head_dim, theta),
        "tie_word_embeddings": "output.weight" not in tensors,
    }
    if model_type == "qwen3_moe":
        layers = range(config["num_hidden_layers"])
        config |= {
            "num_experts": get("expert_count"),
            "num_experts_per_tok": get("expert_used_count"),
            "moe_intermediate_size": get("expert_feed_forward_length"),
            "intermediate_size": md.get(f"{arch}.feed_forward_length", 0),
            "norm_topk_prob": bool(md.get(f"{arch}.expert_weights_norm", True)),
            "decoder_sparse_step": 1,
            "mlp_only_layers": [
                i for i in layers if f"blk.{i}.ffn_gate_inp.weight" not in tensors
            ],
        }
    else:
        config["intermediate_size"] = get("feed_forward_length")
    if model_type == "llama":
        config["attention_bias"] = "blk.0.attn_q.bias" in tensors
        config["mlp_bias"] = "blk.0.ffn_up.bias" in tensors
    return config


def mlx_name(name: str) -> str:
    """llama.cpp tensor name -> mlx-lm parameter name."""
    module, _, suffix = name.rpartition(".")
    if suffix in _SUFFIXES and module in _TOP:
        return f"{_TOP[module]}.{suffix}"
    parts = module.split(".")
    if (
        suffix in _SUFFIXES
        and len(parts) == 3
        and parts[0] == "blk"
        and parts[2] in _LAYER
    ):
        return f"model.layers.{parts[1]}.{_LAYER[parts[2]]}.{suffix}"
    raise ValueError(
        f"GGUF tensor '{name}' has no counterpart in mlx-lm's model; this file is not "
        f"a plain {'/'.join(ARCHITECTURES)} model. {FIX_ARCH}"
    )


def unpermute_rows(x: mx.array, n_heads: int) -> mx.array:
    """Undo llama.cpp's per-head Q/K row interleave (rows only: packed rows work)."""
    rows = x.shape[0]
    return (
        x.reshape(n_heads, rows // n_heads // 2, 2, *x.shape[1:])
        .swapaxes(1, 2)
        .reshape(x.shape)
    )


def _quant_plan(model, header: GGUFHeader, bits: int, group_size: int) -> dict:
    """{module path: quantization params}, chosen as mlx-lm's `quantize_model` would.

    A tensor stored as Q4_0/Q4_1/Q8_0 with the requested bits keeps its exact blocks.
    """
    native = {
        mlx_name(t.name).rpartition(".")[0]
        for t in header.tensors.values()
        if NATIVE_BITS.get(t.kind) == bits and header.kinds() <= MLX_NATIVE
    }
    own = getattr(model, "quant_predicate", None)
    plan = {}
    for path, module in model.named_modules():
        if not hasattr(module, "to_quantized"):
            continue
        if path in native:
            plan[path] = {"group_size": NATIVE_GROUP, "bits": bits}
            continue
        if module.weight.shape[-1] % group_size:
            continue
        params = own(path, module) if own is not None else True
        if params:
            plan[path] = (
                params
                if isinstance(params, dict)
                else {"group_size": group_size, "bits": bits}
            )
    return plan


def _tensors(header: GGUFHeader):
    """(gguf name, float array or (weight, scales, biases) triplet), one at a time."""
    if header.kinds() <= MLX_NATIVE:
        loaded = mx.load(str(header.path))
        for name in list(loaded):
            if not name.endswith((".scales", ".biases")):
                w = loaded.pop(name)
                stem = name[: -len(".weight")]
                if f"{stem}.scales" in loaded:
                    w = (w, loaded.pop(f"{stem}.scales"), loaded.pop(f"{stem}.biases"))
                yield name, w
        return
    for name, info in header.tensors.items():
        arr = to_numpy(header.path, info)
        yield (
            name,
            mx.array(arr).view(mx.bfloat16) if info.kind == "BF16" else mx.array(arr),
        )


def convert_weights(
    header: GGUFHeader, config: dict, plan: dict, dtype: mx.Dtype
) -> dict:
    """mlx-lm weights: unpermuted, cast to `dtype`, quantized where `plan` says."""
    heads = {}
    if config["model_type"] == "llama":
        heads = {
            "q_proj": config["num_attention_heads"],
            "k_proj": config["num_key_value_heads"],
        }
    out = {}
    for name, w in _tensors(header):
        if name == "rope_freqs.weight":
            continue
        key = mlx_name(name)
        module = key.rpartition(".")[0]
        n_heads = heads.get(module.rpartition(".")[2])
        spec = plan.get(module) if key.endswith(".weight") else None
        if isinstance(w, tuple):
            if n_heads:
                w = tuple(unpermute_rows(a, n_heads) for a in w)
            if spec and spec["group_size"] == NATIVE_GROUP and spec["bits"] == _bits(w):
                out[key], out[f"{module}.scales"], out[f"{module}.biases"] = (
                    w[0],
                    w[1].astype(dtype),
                    w[2].astype(dtype),
                )
                mx.eval(out[key], out[f"{module}.scales"], out[f"{module}.biases"])
                continue
            wq, scales, biases = w[0], w[1].astype(dtype), w[2].astype(dtype)
            w = mx.dequantize(
                wq, scales, biases, group_size=NATIVE_GROUP, bits=_bits(w)
            )
        elif n_heads:
            w = unpermute_rows(w, n_heads)
        w = w.astype(dtype)
        if spec:
            q = mx.quantize(w, spec["group_size"], spec["bits"])
            out[key], out[f"{module}.scales"], out[f"{module}.biases"] = q
            mx.eval(*q)
        else:
            out[key] = w
            mx.eval(w)
    return out


def _bits(triplet) -> int:
    w, scales, _ = triplet
    return w.shape[-1] * 32 // (scales.shape[-1] * NATIVE_GROUP)


def float_dtype(header: GGUFHeader) -> mx.Dtype:
    """float32 on CPU (half-precision matmuls are slow there), else the file's."""
    if mx.default_device() == mx.cpu:
        return mx.float32
    kinds = header.kinds()
    if "BF16" in kinds or "MXFP4" in kinds:
        return mx.bfloat16
    return mx.float16 if kinds - {"F32"} else mx.float32


def load_gguf(
    path,
    quantize: int | None = None,
    dtype: mx.Dtype | None = None,
    group_size: int = 64,
    dequantize: bool | None = None,
):
    """Load a llama/qwen2/qwen3/qwen3moe GGUF file as (mlx-lm model, TokenizerWrapper).

    Float weights by default (`dtype`, else `float_dtype`); `quantize=4|8` gives MLX
    affine quantization with `group_size`. `dequantize=True` is the default and is
    accepted for older callers.
    """
    import mlx.nn as nn

    if dequantize is False:
        raise ValueError("load_gguf keeps no GGUF quantization: pass quantize=4 or 8.")
    if quantize not in (None, 4, 8):
        raise ValueError(f"quantize must be 4, 8 or None (float), got {quantize!r}.")
    header = read_header(path)
    config = model_config(header)
    module = importlib.import_module(f"mlx_lm.models.{config['model_type']}")
    model = module.Model(module.ModelArgs.from_dict(config))
    plan = _quant_plan(model, header, quantize, group_size) if quantize else {}
    if plan:
        nn.quantize(model, class_predicate=lambda p, m: plan.get(p, False))
    weights = convert_weights(header, config, plan, dtype or float_dtype(header))
    try:
        model.load_weights(list(weights.items()), strict=True)
    except ValueError as e:
        raise ValueError(
            f"GGUF weights do not fit the model its metadata describes ({e})."
        ) from e
    model.eval()
    model.name_or_path = str(path)
    return model, build_tokenizer(header.metadata)
