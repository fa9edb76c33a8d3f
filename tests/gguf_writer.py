"""A small GGUF writer for tests: F32/F16/Q8_0/Q4_0/Q4_1 tensors, llama.cpp naming and layout.

Written from the GGUF spec, independently of dflash_mlx.gguf, so the loader is checked against
a second implementation. Quantizers follow llama.cpp's reference (`quantize_row_*_ref`).
"""

import json
import struct
from pathlib import Path

import mlx.core as mx
import numpy as np

TYPES = {"F32": 0, "F16": 1, "Q4_0": 2, "Q4_1": 3, "Q8_0": 8}
ALIGN = 32

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
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
}


def gguf_name(name: str) -> str:
    module, suffix = name.rsplit(".", 1)
    top = {
        "model.embed_tokens": "token_embd",
        "model.norm": "output_norm",
        "lm_head": "output",
    }
    if module in top:
        return f"{top[module]}.{suffix}"
    _, _, i, rest = module.split(".", 3)
    return f"blk.{i}.{_LAYER[rest]}.{suffix}"


def permute(w: np.ndarray, n_heads: int) -> np.ndarray:
    """llama.cpp's convert_hf_to_gguf permutation of Q/K rows (HF -> GGUF)."""
    return (
        w.reshape(n_heads, 2, w.shape[0] // n_heads // 2, *w.shape[1:])
        .swapaxes(1, 2)
        .reshape(w.shape)
    )


# --- quantizers: x (rows, cols) float32 -> (raw bytes, dequantized float32 copy) ---


def _blocks(x):
    return x.reshape(-1, 32).astype(np.float32)


def _pack4(q):
    return (q[:, :16] | (q[:, 16:] << 4)).astype(np.uint8)


def q8_0(x):
    b = _blocks(x)
    d = (np.abs(b).max(1) / 127).astype(np.float16)
    inv = np.where(d > 0, 1 / d.astype(np.float32), 0)
    q = np.round(b * inv[:, None]).astype(np.int8)
    raw = np.concatenate([d.view(np.uint8).reshape(-1, 2), q.view(np.uint8)], 1)
    return raw.tobytes(), (d.astype(np.float32)[:, None] * q).reshape(x.shape)


def q4_0(x):
    b = _blocks(x)
    mx_ = b[np.arange(len(b)), np.abs(b).argmax(1)]
    d = (mx_ / -8).astype(np.float16)
    inv = np.where(d != 0, 1 / d.astype(np.float32), 0)
    q = np.clip(np.floor(b * inv[:, None] + 8.5), 0, 15).astype(np.uint8)
    raw = np.concatenate([d.view(np.uint8).reshape(-1, 2), _pack4(q)], 1)
    return raw.tobytes(), (
        d.astype(np.float32)[:, None] * (q.astype(np.float32) - 8)
    ).reshape(x.shape)


def q4_1(x):
    b = _blocks(x)
    lo, hi = b.min(1), b.max(1)
    d, m = ((hi - lo) / 15).astype(np.float16), lo.astype(np.float16)
    inv = np.where(d != 0, 1 / d.astype(np.float32), 0)
    q = np.clip(
        np.floor((b - m.astype(np.float32)[:, None]) * inv[:, None] + 0.5), 0, 15
    )
    q = q.astype(np.uint8)
    raw = np.concatenate(
        [d.view(np.uint8).reshape(-1, 2), m.view(np.uint8).reshape(-1, 2), _pack4(q)], 1
    )
    deq = d.astype(np.float32)[:, None] * q + m.astype(np.float32)[:, None]
    return raw.tobytes(), deq.reshape(x.shape)


QUANTIZERS = {"Q8_0": q8_0, "Q4_0": q4_0, "Q4_1": q4_1}


# --- file format ---


def _str(s: str) -> bytes:
    b = s.encode()
    return struct.pack("<Q", len(b)) + b


def _kv(key, value) -> bytes:
    out = _str(key)
    if isinstance(value, bool):
        return out + struct.pack("<IB", 7, value)
    if isinstance(value, int):
        return out + struct.pack("<II", 4, value)
    if isinstance(value, float):
        return out + struct.pack("<If", 6, value)
    if isinstance(value, str):
        return out + struct.pack("<I", 8) + _str(value)
    if isinstance(value, list) and value and isinstance(value[0], str):
        return (
            out
            + struct.pack("<IIQ", 9, 8, len(value))
            + b"".join(_str(v) for v in value)
        )
    if isinstance(value, list):
        return (
            out
            + struct.pack("<IIQ", 9, 5, len(value))
            + struct.pack(f"<{len(value)}i", *value)
        )
    raise TypeError(f"cannot write {key}={value!r}")


def write(path: Path, tensors: dict, metadata: dict):
    """tensors: name -> (type name, raw bytes, numpy shape)."""
    head = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(metadata))
    head += b"".join(_kv(k, v) for k, v in metadata.items())
    infos, data = b"", b""
    for name, (kind, raw, shape) in tensors.items():
        data += b"\0" * (-len(data) % ALIGN)
        infos += _str(name) + struct.pack("<I", len(shape))
        infos += struct.pack(f"<{len(shape)}Q", *reversed(shape))
        infos += struct.pack("<IQ", TYPES[kind], len(data))
        data += raw
    blob = head + infos
    path.write_bytes(blob + b"\0" * (-len(blob) % ALIGN) + data)


def tokenizer_metadata(tokenizer, pre: str) -> dict:
    """tokenizer.ggml.* metadata from a transformers fast tokenizer (byte-level BPE)."""
    spec = json.loads(tokenizer.backend_tokenizer.to_str())
    vocab = dict(spec["model"]["vocab"])
    added = {t["content"]: t for t in spec["added_tokens"]}
    vocab.update({c: t["id"] for c, t in added.items()})
    tokens = [""] * (max(vocab.values()) + 1)
    for t, i in vocab.items():
        tokens[i] = t
    for i, t in enumerate(tokens):
        tokens[i] = t or f"[PAD{i}]"
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


def write_target(
    target_dir: Path, out: Path, quant: str = "F32", pre: str = "gpt-2"
) -> dict:
    """Write the safetensors target at `target_dir` as GGUF; return the weights it represents."""
    from transformers import AutoTokenizer

    config = json.loads((target_dir / "config.json").read_text())
    weights = {
        k: np.array(v.astype(mx.float32))
        for k, v in mx.load(str(target_dir / "model.safetensors")).items()
    }
    arch = config["model_type"]
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    tensors, represented = {}, {}
    for name, w in weights.items():
        stored = w
        if arch == "llama" and "q_proj" in name:
            stored = permute(w, heads)
        elif arch == "llama" and "k_proj" in name:
            stored = permute(w, kv_heads)
        if quant in QUANTIZERS and w.ndim == 2:
            raw, deq_stored = QUANTIZERS[quant](stored)
            inv = (
                np.argsort(
                    permute(
                        np.arange(w.shape[0]), heads if "q_proj" in name else kv_heads
                    )
                )
                if stored is not w
                else None
            )
            represented[name] = deq_stored if inv is None else deq_stored[inv]
            tensors[gguf_name(name)] = (quant, raw, w.shape)
        elif quant == "F16" and w.ndim == 2:
            tensors[gguf_name(name)] = (
                "F16",
                stored.astype(np.float16).tobytes(),
                w.shape,
            )
            represented[name] = w.astype(np.float16).astype(np.float32)
        else:
            tensors[gguf_name(name)] = (
                "F32",
                stored.astype(np.float32).tobytes(),
                w.shape,
            )
            represented[name] = w
    md = {
        "general.architecture": arch,
        "general.alignment": ALIGN,
        f"{arch}.block_count": config["num_hidden_layers"],
        f"{arch}.embedding_length": config["hidden_size"],
        f"{arch}.feed_forward_length": config["intermediate_size"],
        f"{arch}.attention.head_count": heads,
        f"{arch}.attention.head_count_kv": kv_heads,
        f"{arch}.attention.layer_norm_rms_epsilon": float(config["rms_norm_eps"]),
        f"{arch}.rope.freq_base": float(config["rope_theta"]),
        f"{arch}.context_length": config["max_position_embeddings"],
    }
    if "head_dim" in config:
        md[f"{arch}.attention.key_length"] = config["head_dim"]
        md[f"{arch}.attention.value_length"] = config["head_dim"]
    md.update(tokenizer_metadata(AutoTokenizer.from_pretrained(str(target_dir)), pre))
    write(out, tensors, md)
    return represented


def save_reference(target_dir: Path, weights: dict, out: Path) -> Path:
    """A safetensors copy of `target_dir` holding `weights` (what a GGUF file represents)."""
    import shutil

    shutil.copytree(target_dir, out)
    mx.save_safetensors(
        str(out / "model.safetensors"),
        {k: mx.array(v) for k, v in weights.items()},
        metadata={"format": "mlx"},
    )
    return out
