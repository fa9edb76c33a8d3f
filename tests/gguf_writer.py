"""GGUF files of tiny targets for tests, written the way llama.cpp writes them.

The container is the `gguf` package's own `GGUFWriter`; F16/BF16/Q8_0/Q4_0/Q4_1/MXFP4
blocks come from `gguf.quants.quantize`. It has no quantizer for K-quants and IQ types,
so Q4_K, Q5_K, Q6_K and IQ4_XS blocks are packed here from the ggml block layouts, and
their values are computed here too: the loader's dequantization (`gguf.quants`) is then
checked against a second implementation.
"""

import json
from pathlib import Path

import gguf
import mlx.core as mx
import numpy as np

QK = 256  # K-quant super-block
IQ4_VALUES = np.array(
    [-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113],
    np.float32,
)
_LAYER = {
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
    "mlp.gate": "ffn_gate_inp",
    "mlp.switch_mlp.gate_proj": "ffn_gate_exps",
    "mlp.switch_mlp.up_proj": "ffn_up_exps",
    "mlp.switch_mlp.down_proj": "ffn_down_exps",
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
}
_GPT_OSS = {
    "post_attention_layernorm": "post_attention_norm",
    "mlp.router": "ffn_gate_inp",
    "mlp.experts.gate_proj": "ffn_gate_exps",
    "mlp.experts.up_proj": "ffn_up_exps",
    "mlp.experts.down_proj": "ffn_down_exps",
    "mlp.experts.gate_up_proj": "ffn_gate_up_exps",
}
# Gemma 3's four norms per layer.
_GEMMA3 = {
    "post_attention_layernorm": "post_attention_norm",
    "pre_feedforward_layernorm": "ffn_norm",
    "post_feedforward_layernorm": "post_ffw_norm",
}
_ARCH = {
    "gemma3_text": "gemma3",
    "llama": "llama",
    "qwen2": "qwen2",
    "qwen3": "qwen3",
    "qwen3_moe": "qwen3moe",
    "gpt_oss": "gpt-oss",
}
_EXPERTS = ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps", "ffn_gate_up_exps")
# Mixes as llama.cpp makes them: (type by tensor role, type of the other matrices).
MIXES = {
    "Q4_K_M": ({"attn_v": "Q6_K", "ffn_down": "Q6_K", "token_embd": "Q8_0"}, "Q4_K"),
    "MXFP4_MOE": (dict.fromkeys(_EXPERTS, "MXFP4"), "Q8_0"),
}


def gguf_name(name: str, model_type: str = "llama") -> str:
    if name.endswith(".self_attn.sinks"):
        return f"blk.{name.split('.')[2]}.attn_sinks.weight"
    module, suffix = name.rsplit(".", 1)
    top = {
        "model.embed_tokens": "token_embd",
        "model.norm": "output_norm",
        "lm_head": "output",
    }
    if module in top:
        return f"{top[module]}.{suffix}"
    _, _, i, rest = module.split(".", 3)
    family = {"gpt_oss": _GPT_OSS, "gemma3_text": _GEMMA3}.get(model_type, {})
    names = _LAYER | family
    return f"blk.{i}.{names[rest]}.{suffix}"


def permute(w: np.ndarray, n_heads: int) -> np.ndarray:
    """llama.cpp's convert_hf_to_gguf permutation of Q/K rows (HF -> GGUF)."""
    return (
        w.reshape(n_heads, 2, w.shape[0] // n_heads // 2, *w.shape[1:])
        .swapaxes(1, 2)
        .reshape(w.shape)
    )


# --- block packers: x (n, 256) float32 -> (raw bytes (n, block bytes), values) ---


def _f16(x):
    return x.astype(np.float16)


def _scales_and_q(b, qmax):
    """Per 32-value sub-block x ~ D*q - M: 6-bit scales and mins under f16 d, dmin."""
    lo, hi = np.minimum(b.min(-1), 0), b.max(-1)
    scale, mins = (hi - lo) / qmax, -lo
    d, dmin = _f16(scale.max(-1) / 63), _f16(mins.max(-1) / 63)
    d32, dmin32 = d.astype(np.float32)[:, None], dmin.astype(np.float32)[:, None]
    sc = np.clip(
        np.round(np.divide(scale, d32, np.zeros_like(scale), where=d32 > 0)), 0, 63
    )
    m = np.clip(
        np.round(np.divide(mins, dmin32, np.zeros_like(mins), where=dmin32 > 0)), 0, 63
    )
    big_d, big_m = (d32 * sc)[..., None], (dmin32 * m)[..., None]
    q = np.divide(b + big_m, big_d, np.zeros_like(b), where=big_d > 0)
    q = np.clip(np.round(q), 0, qmax).astype(np.uint8)
    values = (big_d * q.astype(np.float32) - big_m).reshape(len(b), QK)
    return d, dmin, sc.astype(np.uint8), m.astype(np.uint8), q, values


def _pack_scales(sc, m):
    lo = (sc[:, :4] & 63) | ((sc[:, 4:] >> 4) << 6)
    mid = (m[:, :4] & 63) | ((m[:, 4:] >> 4) << 6)
    hi = (sc[:, 4:] & 15) | ((m[:, 4:] & 15) << 4)
    return np.concatenate([lo, mid, hi], 1).astype(np.uint8)


def _nibbles(q):  # (n, 2k, 32) -> (n, k*32): sub-block 2c low nibble, 2c+1 high nibble
    return (q[:, 0::2] & 15 | (q[:, 1::2] & 15) << 4).reshape(len(q), -1)


def q4_k(x):
    b = x.reshape(-1, 8, 32)
    d, dmin, sc, m, q, values = _scales_and_q(b, 15)
    head = np.concatenate(
        [d.view(np.uint8).reshape(-1, 2), dmin.view(np.uint8).reshape(-1, 2)], 1
    )
    return np.concatenate([head, _pack_scales(sc, m), _nibbles(q)], 1), values


def q5_k(x):
    b = x.reshape(-1, 8, 32)
    d, dmin, sc, m, q, values = _scales_and_q(b, 31)
    head = np.concatenate(
        [d.view(np.uint8).reshape(-1, 2), dmin.view(np.uint8).reshape(-1, 2)], 1
    )
    qh = sum(((q[:, j] >> 4) & 1) << j for j in range(8)).astype(np.uint8)
    return np.concatenate([head, _pack_scales(sc, m), qh, _nibbles(q)], 1), values


def q6_k(x):
    b = x.reshape(-1, 16, 16)
    s = np.abs(b).max(-1) / 31
    d = _f16(s.max(-1) / 127)
    d32 = d.astype(np.float32)[:, None]
    sc = np.clip(
        np.round(np.divide(s, d32, np.zeros_like(s), where=d32 > 0)), -128, 127
    )
    big_d = (d32 * sc)[..., None]
    q = np.clip(
        np.round(np.divide(b, big_d, np.zeros_like(b), where=big_d > 0)) + 32, 0, 63
    )
    values = (big_d * (q - 32)).reshape(len(b), QK)
    q = q.astype(np.uint8).reshape(-1, 2, 128)  # two halves of 128 values
    ql = (q[:, :, :64] & 15) | ((q[:, :, 64:] & 15) << 4)
    qh = sum(((q[:, :, k * 32 : (k + 1) * 32] >> 4) & 3) << (2 * k) for k in range(4))
    raw = [ql.reshape(-1, 128), qh.astype(np.uint8).reshape(-1, 64)]
    raw += [sc.astype(np.int8).view(np.uint8), d.view(np.uint8).reshape(-1, 2)]
    return np.concatenate(raw, 1), values


def iq4_xs(x):
    b = x.reshape(-1, 8, 32)
    peak = np.take_along_axis(b, np.abs(b).argmax(-1)[..., None], -1)[..., 0]
    s = peak / -127  # the largest value maps to the grid's -127
    d = _f16(np.abs(s).max(-1) / 31)
    d32 = d.astype(np.float32)[:, None]
    ls = np.clip(np.round(np.divide(s, d32, np.zeros_like(s), where=d32 > 0)), -32, 31)
    big_d = (d32 * ls)[..., None]
    scaled = np.divide(b, big_d, np.zeros_like(b), where=big_d != 0)
    q = np.abs(scaled[..., None] - IQ4_VALUES).argmin(-1).astype(np.uint8)
    values = (big_d * IQ4_VALUES[q]).reshape(len(b), QK)
    ls = (ls + 32).astype(np.uint8)
    scales_h = sum(((ls[:, j].astype(np.uint16) >> 4) & 3) << (2 * j) for j in range(8))
    scales_l = (ls[:, 0::2] & 15) | ((ls[:, 1::2] & 15) << 4)
    qs = (q[..., :16] | (q[..., 16:] << 4)).reshape(len(b), 128)
    raw = [
        d.view(np.uint8).reshape(-1, 2),
        scales_h.astype(np.uint16).view(np.uint8).reshape(-1, 2),
    ]
    return np.concatenate([*raw, scales_l, qs], 1), values


PACKERS = {"Q4_K": q4_k, "Q5_K": q5_k, "Q6_K": q6_k, "IQ4_XS": iq4_xs}
LIBRARY = ("Q8_0", "Q4_0", "Q4_1", "BF16", "MXFP4")


def encode(w: np.ndarray, kind: str) -> tuple[np.ndarray, np.ndarray]:
    """(raw GGUF bytes or plain array, the float32 values they represent) of `w`."""
    if kind == "F32":
        return w.astype(np.float32), w.astype(np.float32)
    if kind == "F16":
        return w.astype(np.float16), w.astype(np.float16).astype(np.float32)
    qtype = gguf.GGMLQuantizationType[kind]
    if kind in PACKERS:
        raw, values = PACKERS[kind](w.reshape(-1, QK).astype(np.float32))
        return raw.reshape(*w.shape[:-1], -1), values.reshape(w.shape)
    raw = gguf.quants.quantize(w.astype(np.float32), qtype)
    return raw, gguf.quants.dequantize(raw, qtype).reshape(w.shape)


def _add_metadata(writer, md: dict):
    for key, value in md.items():
        if key == "general.architecture":
            continue
        if isinstance(value, bool):
            writer.add_bool(key, value)
        elif isinstance(value, int):
            writer.add_uint32(key, value)
        elif isinstance(value, float):
            writer.add_float32(key, value)
        elif isinstance(value, str):
            writer.add_string(key, value)
        elif isinstance(value, list):
            writer.add_array(key, value)
        else:
            raise TypeError(f"cannot write {key}={value!r}")


def write(path: Path, tensors: dict, metadata: dict):
    """tensors: GGUF name -> (ggml type name, array from `encode`)."""
    writer = gguf.GGUFWriter(str(path), metadata["general.architecture"])
    _add_metadata(writer, metadata)
    for name, (kind, data) in tensors.items():
        if kind in ("F32", "F16"):
            writer.add_tensor(name, data)
        else:
            writer.add_tensor(name, data, raw_dtype=gguf.GGMLQuantizationType[kind])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def tokenizer_metadata(tokenizer, pre: str) -> dict:
    """tokenizer.ggml.* metadata from a transformers fast tokenizer (byte-level BPE)."""
    spec = json.loads(tokenizer.backend_tokenizer.to_str())
    vocab = dict(spec["model"]["vocab"])
    added = {t["content"]: t for t in spec["added_tokens"]}
    vocab.update({c: t["id"] for c, t in added.items()})
    tokens = [""] * (max(vocab.values()) + 1)
    for t, i in vocab.items():
        tokens[i] = t
    tokens = [t or f"[PAD{i}]" for i, t in enumerate(tokens)]
    types = [
        3 if t in added and added[t]["special"] else 4 if t in added else 1
        for t in tokens
    ]
    merges = [m if isinstance(m, str) else " ".join(m) for m in spec["model"]["merges"]]
    md = {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": pre,
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": types,
        "tokenizer.ggml.eos_token_id": tokenizer.eos_token_id,
        "tokenizer.ggml.add_bos_token": False,
        "tokenizer.chat_template": tokenizer.chat_template,
    }
    if merges:
        md["tokenizer.ggml.merges"] = merges
    return md


def _kind(gname: str, w: np.ndarray, quant: str) -> str:
    if w.ndim < 2 or ".ffn_gate_inp." in gname:
        return "F32"  # norms, biases and the MoE router stay F32, as in llama.cpp
    roles, default = MIXES.get(quant, ({}, quant))
    return roles.get(gname.split(".")[-2], default)


def _hparams(config: dict) -> dict:
    arch = _ARCH[config["model_type"]]
    md = {
        "general.architecture": arch,
        f"{arch}.block_count": config["num_hidden_layers"],
        f"{arch}.embedding_length": config["hidden_size"],
        f"{arch}.feed_forward_length": config["intermediate_size"],
        f"{arch}.attention.head_count": config["num_attention_heads"],
        f"{arch}.attention.head_count_kv": config["num_key_value_heads"],
        f"{arch}.attention.layer_norm_rms_epsilon": float(config["rms_norm_eps"]),
        f"{arch}.rope.freq_base": float(config["rope_theta"]),
        f"{arch}.context_length": config["max_position_embeddings"],
    }
    if "head_dim" in config:
        md[f"{arch}.attention.key_length"] = config["head_dim"]
        md[f"{arch}.attention.value_length"] = config["head_dim"]
    if arch == "qwen3moe":
        md[f"{arch}.expert_count"] = config["num_experts"]
        md[f"{arch}.expert_used_count"] = config["num_experts_per_tok"]
        md[f"{arch}.expert_feed_forward_length"] = config["moe_intermediate_size"]
    if arch == "gemma3":
        md[f"{arch}.attention.sliding_window"] = config["sliding_window"]
    if arch == "gpt-oss":
        md[f"{arch}.expert_count"] = config["num_local_experts"]
        md[f"{arch}.expert_used_count"] = config["num_experts_per_tok"]
        md[f"{arch}.expert_feed_forward_length"] = config["intermediate_size"]
        md[f"{arch}.attention.sliding_window"] = config["sliding_window"]
    yarn = config.get("rope_scaling") or {}
    if yarn.get("rope_type", yarn.get("type")) == "yarn":
        md[f"{arch}.rope.scaling.type"] = "yarn"
        md[f"{arch}.rope.scaling.factor"] = float(yarn["factor"])
        orig = yarn["original_max_position_embeddings"]
        md[f"{arch}.rope.scaling.original_context_length"] = orig
    return md


def _fuse_gate_up(weights: dict) -> dict:
    """Newer llama.cpp's fused expert layout: gate rows, then up rows, in one tensor."""
    out = dict(weights)
    for name in [n for n in weights if ".experts.gate_proj." in n]:
        up = out.pop(name.replace("gate_proj", "up_proj"))
        axis = -2 if name.endswith(".weight") else -1
        fused = np.concatenate([out.pop(name), up], axis)
        out[name.replace("gate_proj", "gate_up_proj")] = fused
    return out


def write_target(
    target_dir: Path,
    out: Path,
    quant: str = "F32",
    pre: str = "gpt-2",
    fuse_gate_up: bool = False,
) -> dict:
    """Write the target at `target_dir` as GGUF; return the weights it represents."""
    from transformers import AutoTokenizer

    config = json.loads((target_dir / "config.json").read_text())
    weights = {
        k: np.array(v.astype(mx.float32))
        for k, v in mx.load(str(target_dir / "model.safetensors")).items()
    }
    heads = {
        "q_proj": config["num_attention_heads"],
        "k_proj": config["num_key_value_heads"],
    }
    if fuse_gate_up:
        weights = _fuse_gate_up(weights)
    tensors, represented = {}, {}
    for name, w in weights.items():
        gname = gguf_name(name, config["model_type"])
        llama = config["model_type"] == "llama"
        n_heads = heads.get(name.split(".")[-2]) if llama else None
        stored = permute(w, n_heads) if n_heads else w
        shift = config["model_type"] == "gemma3_text" and name.endswith("norm.weight")
        if shift:  # llama.cpp's Gemma converter stores the norms as 1 + w
            stored = stored + np.float32(1)
        kind = _kind(gname, w, quant)
        data, values = encode(stored, kind)
        if shift:
            values = values - np.float32(1)
        if n_heads:  # the values in HF row order
            values = values[np.argsort(permute(np.arange(w.shape[0]), n_heads))]
        tensors[gname] = (kind, data)
        if ".gate_up_proj." in name:
            axis = -2 if name.endswith(".weight") else -1
            gate, up = np.split(values, 2, axis)
            represented[name.replace("gate_up_proj", "gate_proj")] = gate
            represented[name.replace("gate_up_proj", "up_proj")] = up
        else:
            represented[name] = values
    md = _hparams(config)
    md.update(tokenizer_metadata(AutoTokenizer.from_pretrained(str(target_dir)), pre))
    write(out, tensors, md)
    return represented


def save_reference(target_dir: Path, weights: dict, out: Path) -> Path:
    """A copy of `target_dir` holding `weights` (what a GGUF file represents)."""
    import shutil

    shutil.copytree(target_dir, out)
    mx.save_safetensors(
        str(out / "model.safetensors"),
        {k: mx.array(v) for k, v in weights.items()},
        metadata={"format": "mlx"},
    )
    return out
