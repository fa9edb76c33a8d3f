"""Which z-lab drafter serves which target, so users can name only the target."""

import re

# z-lab's DFlash collection (https://huggingface.co/collections/z-lab/dflash and
# .../dflash-2) as read on 2026-12-03, for the families mlx-lm 0.32 loads and this
# package verifies; docs/drafters.md lists every drafter, the sources and what could
# not be checked (the Hub itself is not reachable from where this was written).
# Target base name (lower case, no owner, no quantization suffix) ->
# (drafter repo, the target's mlx-lm model_type).
DRAFTERS = {
    "gemma-4-31b-it": ("z-lab/gemma-4-31B-it-DFlash", "gemma4"),
    "gemma-4-26b-a4b-it": ("z-lab/gemma-4-26B-A4B-it-DFlash", "gemma4"),
    "gemma-4-12b-it": ("z-lab/gemma4-12B-it-DFlash", "gemma4"),
    "qwen3.8-27b": ("z-lab/Qwen3.8-27B-DFlash2", "qwen3_5"),
    "muse-glimmer-30b": ("z-lab/Muse-Glimmer-30B-DFlash2", "muse_glimmer"),
    "qwen3-4b": ("z-lab/Qwen3-4B-DFlash-b16", "qwen3"),
    "qwen3-8b": ("z-lab/Qwen3-8B-DFlash-b16", "qwen3"),
    "qwen3-coder-30b-a3b-instruct": ("z-lab/Qwen3-Coder-30B-A3B-DFlash", "qwen3_moe"),
    "qwen3-coder-next": ("z-lab/Qwen3-Coder-Next-DFlash", "qwen3_next"),
    "qwen3.5-4b": ("z-lab/Qwen3.5-4B-DFlash", "qwen3_5"),
    "qwen3.5-9b": ("z-lab/Qwen3.5-9B-DFlash", "qwen3_5"),
    "qwen3.5-27b": ("z-lab/Qwen3.5-27B-DFlash", "qwen3_5"),
    "qwen3.5-35b-a3b": ("z-lab/Qwen3.5-35B-A3B-DFlash", "qwen3_5_moe"),
    "qwen3.5-122b-a10b": ("z-lab/Qwen3.5-122B-A10B-DFlash", "qwen3_5_moe"),
    "qwen3.5-397b-a17b": ("z-lab/Qwen3.5-397B-A17B-DFlash", "qwen3_5_moe"),
    "qwen3.6-27b": ("z-lab/Qwen3.6-27B-DFlash", "qwen3_5"),
    "qwen3.6-35b-a3b": ("z-lab/Qwen3.6-35B-A3B-DFlash", "qwen3_5_moe"),
    "gpt-oss-20b": ("z-lab/gpt-oss-20b-DFlash", "gpt_oss"),
    "gpt-oss-120b": ("z-lab/gpt-oss-120b-DFlash", "gpt_oss"),
    "llama-3.1-8b-instruct": ("z-lab/LLaMA3.1-8B-Instruct-DFlash-UltraChat", "llama"),
    "meta-llama-3.1-8b-instruct": (
        "z-lab/LLaMA3.1-8B-Instruct-DFlash-UltraChat",
        "llama",
    ),
    "kimi-k2.5": ("z-lab/Kimi-K2.5-DFlash", "kimi_k25"),
    "kimi-k2.6": ("z-lab/Kimi-K2.6-DFlash", "kimi_k25"),
    "minimax-m2.5": ("z-lab/MiniMax-M2.5-DFlash", "minimax"),
    "minimax-m2.7": ("z-lab/MiniMax-M2.7-DFlash", "minimax"),
    "glm-5.1": ("z-lab/GLM-5.1-FP8-DFlash", "glm_moe_dsa"),
}

# Suffixes that mlx-community and others append to quantized or converted copies.
_SUFFIX = re.compile(
    r"(-(mlx|instruct-2507|[2-8]bit|[2-8]-bit|bf16|fp16|f16|fp8|mxfp4|mxfp8|nvfp4|dwq|awq|gptq"
    r"|q[2-8](_[a-z0-9]+)?|optiq|dynamic|qat|gguf))+$"
)


def base_name(target: str) -> str:
    """'mlx-community/Qwen3.5-4B-4bit' -> 'qwen3.5-4b'."""
    name = target.rstrip("/").rsplit("/", 1)[-1].lower()
    name = re.sub(r"\.gguf$", "", name)
    return _SUFFIX.sub("", name)


def drafter_for(target: str) -> str | None:
    """The z-lab drafter for a target Hub id or folder name, or None when unknown."""
    entry = DRAFTERS.get(base_name(target))
    return entry[0] if entry else None
