"""GGUF metadata -> the mlx-lm config and parameter names of the model it describes.

The architectures read here, the supported DFlash families refused as GGUF (with what to
do instead), Hugging Face config fields from `{arch}.*` metadata, and llama.cpp's tensor
names mapped to mlx-lm's.
"""

import mlx.core as mx

from .file import GGUFHeader, to_numpy

# GGUF `general.architecture` -> mlx-lm model_type.
ARCHITECTURES = {
    "llama": "llama",
    "qwen2": "qwen2",
    "qwen3": "qwen3",
    "qwen3moe": "qwen3_moe",
    "gpt-oss": "gpt_oss",
    "gemma3": "gemma3_text",
}
# Supported target families whose llama.cpp conversion rewrites tensors beyond renaming.
REFUSED = {
    "qwen35": "qwen3_5",
    "qwen35moe": "qwen3_5_moe",
    "qwen3next": "qwen3_next",
    "gemma4": "gemma4",
    "deepseek2": "deepseek_v3 / kimi_k25",
    "minimax-m2": "minimax",
}
_WHY = dict.fromkeys(
    ("qwen35", "qwen35moe", "qwen3next"),
    "llama.cpp's converter rewrites its linear-attention tensors (A_log stored as "
    "-exp(A_log), norms shifted by 1, q/k/v/z regrouped, V heads reordered by newer "
    "versions) and the inverse is not implemented here",
) | {
    "gemma4": "llama.cpp's converter rewrites its norms and per-layer-input tensors "
    "and the inverse is not implemented here",
    "deepseek2": "llama.cpp stores its MLA projections in two layouts (attn_kv_b, or "
    "attn_k_b/attn_v_b in newer files), not mapped here",
    "minimax-m2": "its llama.cpp layout is not mapped here",
}
# Families whose norms compute x * (1 + w): llama.cpp's converter stores 1 + w (what
# its own graph multiplies by), so the loader takes the 1 back off every *norm.weight.
NORM_SHIFT = {"gemma3_text": 1.0}
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
# gpt-oss names a few of the same tensors differently on both sides.
_GPT_OSS = {
    "post_attention_norm": "post_attention_layernorm",
    "ffn_gate_inp": "mlp.router",
    "ffn_gate_exps": "mlp.experts.gate_proj",
    "ffn_up_exps": "mlp.experts.up_proj",
    "ffn_down_exps": "mlp.experts.down_proj",
    "ffn_gate_up_exps": "mlp.experts.gate_up_proj",  # fused by newer llama.cpp
}
# Gemma 3 has four norms per layer: around the attention and around the MLP.
_GEMMA3 = {
    "post_attention_norm": "post_attention_layernorm",
    "ffn_norm": "pre_feedforward_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
}
_FAMILY_NAMES = {"gpt_oss": _GPT_OSS, "gemma3_text": _GEMMA3}
_BARE = {"attn_sinks": "self_attn.sinks"}  # a parameter, not a module's weight
_SUFFIXES = ("weight", "bias")


def check_architecture(md: dict) -> str:
    """The mlx-lm model_type of a GGUF file, or a ValueError that says what to do."""
    arch = md.get("general.architecture")
    if arch in ARCHITECTURES:
        return ARCHITECTURES[arch]
    if arch in REFUSED:
        raise ValueError(
            f"GGUF architecture '{arch}' (mlx-lm '{REFUSED[arch]}', a supported DFlash "
            f"target) is not read from GGUF here: {_WHY[arch]}. {FIX_ARCH}"
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
        cfg = {
            "type": "yarn",
            "factor": factor,
            "original_max_position_embeddings": orig,
        }
        for key in ("beta_fast", "beta_slow"):  # mlx-lm's defaults are llama.cpp's
            if f"{arch}.rope.scaling.yarn_{key}" in md:
                cfg[key] = md[f"{arch}.rope.scaling.yarn_{key}"]
        return cfg
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
    return config | _family_fields(model_type, header, get)


def _family_fields(model_type: str, header: GGUFHeader, get) -> dict:
    """The config fields of one family: experts, sliding window, feed-forward size,
    biases (`get` reads the architecture's metadata, failing on a missing key)."""
    md, tensors = header.metadata, header.tensors
    arch = md["general.architecture"]
    if model_type == "qwen3_moe":
        return {
            "num_experts": get("expert_count"),
            "num_experts_per_tok": get("expert_used_count"),
            "moe_intermediate_size": get("expert_feed_forward_length"),
            "intermediate_size": md.get(f"{arch}.feed_forward_length", 0),
            "norm_topk_prob": bool(md.get(f"{arch}.expert_weights_norm", True)),
            "decoder_sparse_step": 1,
            "mlp_only_layers": [
                i
                for i in range(get("block_count"))
                if f"blk.{i}.ffn_gate_inp.weight" not in tensors
            ],
        }
    if model_type == "gpt_oss":
        return {
            "num_local_experts": get("expert_count"),
            "num_experts_per_tok": get("expert_used_count"),
            "intermediate_size": get("expert_feed_forward_length"),
            "sliding_window": get("attention.sliding_window"),
        }
    fields = {"intermediate_size": get("feed_forward_length")}
    if model_type == "gemma3_text":
        return fields | _gemma3_fields(md, arch, get)
    if model_type == "llama":
        fields["attention_bias"] = "blk.0.attn_q.bias" in tensors
        fields["mlp_bias"] = "blk.0.ffn_up.bias" in tensors
    return fields


def _gemma3_fields(md: dict, arch: str, get) -> dict:
    """Gemma 3's fields that llama.cpp does not store but fixes by architecture: five
    sliding layers in six with rope base 10000, and the query scale (head_dim, except
    hidden/heads on the 62-layer 27B)."""
    cap = md.get(f"{arch}.final_logit_softcapping")
    if cap:
        raise ValueError(
            f"This gemma3 GGUF soft-caps its logits ({cap}), which mlx-lm's "
            f"gemma3_text does not do. {FIX_ARCH}"
        )
    heads, hidden = get("attention.head_count"), get("embedding_length")
    head_dim = md.get(f"{arch}.attention.key_length", hidden // heads)
    window = md.get(f"{arch}.attention.sliding_window") or 0
    return {
        "query_pre_attn_scalar": hidden // heads
        if get("block_count") == 62
        else head_dim,
        "sliding_window": window or get("context_length"),
        "sliding_window_pattern": 6 if window else 1,  # 1: every layer global
        "rope_local_base_freq": 10000.0,
    }


def mlx_name(name: str, model_type: str = "llama") -> str:
    """llama.cpp tensor name -> mlx-lm parameter name."""
    module, _, suffix = name.rpartition(".")
    if suffix in _SUFFIXES and module in _TOP:
        return f"{_TOP[module]}.{suffix}"
    parts = module.split(".")
    if suffix in _SUFFIXES and len(parts) == 3 and parts[0] == "blk":
        prefix, role = f"model.layers.{parts[1]}", parts[2]
        if role in _BARE and suffix == "weight":
            return f"{prefix}.{_BARE[role]}"
        names = _LAYER | _FAMILY_NAMES.get(model_type, {})
        if role in names:
            return f"{prefix}.{names[role]}.{suffix}"
    raise ValueError(
        f"GGUF tensor '{name}' has no counterpart in mlx-lm's {model_type} model; the "
        f"file is not a plain {'/'.join(ARCHITECTURES)} model. {FIX_ARCH}"
    )
