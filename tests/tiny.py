"""Tiny random-weight targets and drafters, saved like real checkpoints."""

import gzip
import json
import shutil
from pathlib import Path

import mlx.core as mx
from mlx.utils import tree_flatten, tree_map

ASSETS = Path(__file__).parent / "assets"
# Qwen3's real tokenizer and template, shared with the examples' scripted agent
QWEN3 = Path(__file__).resolve().parents[1] / "examples" / "assets" / "qwen3"
BYTE_VOCAB = 272  # 256 bytes + specials, rounded up

_COMMON = dict(
    hidden_size=64,
    intermediate_size=128,
    num_attention_heads=4,
    num_key_value_heads=2,
    rms_norm_eps=1e-6,
    max_position_embeddings=4096,
    rope_theta=10000.0,
)

FAMILIES = {
    "llama": dict(model_type="llama", num_hidden_layers=4, tie_word_embeddings=True),
    "qwen2": dict(model_type="qwen2", num_hidden_layers=4, tie_word_embeddings=False),
    "qwen3": dict(
        model_type="qwen3", num_hidden_layers=4, head_dim=16, tie_word_embeddings=True
    ),
    "qwen3_moe": dict(
        model_type="qwen3_moe",
        num_hidden_layers=4,
        head_dim=16,
        num_experts=4,
        num_experts_per_tok=2,
        decoder_sparse_step=1,
        mlp_only_layers=[],
        moe_intermediate_size=32,
        norm_topk_prob=True,
        tie_word_embeddings=False,
    ),
    "qwen3_5": dict(
        model_type="qwen3_5",
        num_hidden_layers=4,
        head_dim=16,
        linear_num_value_heads=4,
        linear_num_key_heads=2,
        linear_key_head_dim=16,
        linear_value_head_dim=16,
        linear_conv_kernel_dim=4,
        full_attention_interval=2,
        tie_word_embeddings=True,
        rope_parameters={
            "type": "default",
            "rope_theta": 10000.0,
            "partial_rotary_factor": 0.5,
            "mrope_section": [2, 1, 1],
        },
    ),
    "qwen3_5_moe": dict(
        model_type="qwen3_5_moe",
        num_hidden_layers=4,
        head_dim=16,
        linear_num_value_heads=4,
        linear_num_key_heads=2,
        linear_key_head_dim=16,
        linear_value_head_dim=16,
        linear_conv_kernel_dim=4,
        full_attention_interval=2,
        tie_word_embeddings=False,
        num_experts=4,
        num_experts_per_tok=2,
        decoder_sparse_step=1,
        shared_expert_intermediate_size=32,
        moe_intermediate_size=32,
        rope_parameters={
            "type": "default",
            "rope_theta": 10000.0,
            "partial_rotary_factor": 0.5,
            "mrope_section": [2, 1, 1],
        },
    ),
    "gemma3_text": dict(
        model_type="gemma3_text",
        num_hidden_layers=4,  # sliding, sliding, global, sliding
        head_dim=16,
        num_key_value_heads=1,
        query_pre_attn_scalar=16,
        sliding_window=8,
        sliding_window_pattern=3,
        rope_local_base_freq=10000.0,
        tie_word_embeddings=True,  # mlx-lm ties it when lm_head is absent
        _embed_scale=0.25,
    ),
    "gemma4_text": dict(
        model_type="gemma4_text",
        num_hidden_layers=6,
        head_dim=16,
        global_head_dim=16,
        num_key_value_heads=1,
        num_kv_shared_layers=2,
        hidden_size_per_layer_input=8,
        vocab_size_per_layer_input=BYTE_VOCAB,
        sliding_window=6,
        sliding_window_pattern=3,
        final_logit_softcapping=30.0,
        use_double_wide_mlp=False,
        tie_word_embeddings=True,
        _embed_scale=0.25,
    ),
    "gemma4": dict(
        model_type="gemma4",
        num_hidden_layers=6,
        _embed_scale=0.25,
        text_config=dict(
            model_type="gemma4_text",
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=6,
            num_attention_heads=4,
            head_dim=16,
            global_head_dim=16,
            num_key_value_heads=1,
            num_kv_shared_layers=2,
            hidden_size_per_layer_input=8,
            vocab_size_per_layer_input=BYTE_VOCAB,
            sliding_window=6,
            sliding_window_pattern=3,
            final_logit_softcapping=30.0,
            use_double_wide_mlp=False,
            tie_word_embeddings=True,
        ),
    ),
    "qwen3_next": dict(
        model_type="qwen3_next",
        num_hidden_layers=4,
        head_dim=16,
        linear_num_value_heads=4,
        linear_num_key_heads=2,
        linear_key_head_dim=16,
        linear_value_head_dim=16,
        linear_conv_kernel_dim=4,
        full_attention_interval=2,
        num_experts=4,
        num_experts_per_tok=2,
        decoder_sparse_step=1,
        shared_expert_intermediate_size=32,
        mlp_only_layers=[],
        moe_intermediate_size=32,
        partial_rotary_factor=0.5,
        tie_word_embeddings=False,
    ),
    "deepseek_v3": dict(
        model_type="deepseek_v3",
        num_hidden_layers=4,
        num_key_value_heads=4,
        moe_intermediate_size=32,
        n_shared_experts=1,
        n_routed_experts=4,
        num_experts_per_tok=2,
        first_k_dense_replace=1,
        kv_lora_rank=32,
        q_lora_rank=64,
        qk_rope_head_dim=8,
        v_head_dim=16,
        qk_nope_head_dim=16,
        n_group=1,
        topk_group=1,
    ),
    "kimi_k25": dict(
        model_type="kimi_k25",
        num_hidden_layers=4,
        text_config=dict(
            model_type="deepseek_v3",
            vocab_size=BYTE_VOCAB,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=4,
            num_attention_heads=4,
            num_key_value_heads=4,
            moe_intermediate_size=32,
            n_shared_experts=1,
            n_routed_experts=4,
            num_experts_per_tok=2,
            first_k_dense_replace=1,
            kv_lora_rank=32,
            q_lora_rank=None,
            qk_rope_head_dim=8,
            v_head_dim=16,
            qk_nope_head_dim=16,
            rms_norm_eps=1e-6,
            max_position_embeddings=4096,
        ),
    ),
    "minimax": dict(
        model_type="minimax",
        num_hidden_layers=4,
        head_dim=16,
        num_local_experts=4,
        num_experts_per_tok=2,
        shared_intermediate_size=0,
        rotary_dim=8,
        use_qk_norm=True,
        tie_word_embeddings=False,
    ),
    "glm_moe_dsa": dict(
        model_type="glm_moe_dsa",
        num_hidden_layers=4,
        num_key_value_heads=4,
        index_head_dim=16,
        index_n_heads=2,
        index_topk=4,  # fewer than the prompts' keys: the sparse selection is used
        moe_intermediate_size=32,
        n_shared_experts=1,
        n_routed_experts=4,
        routed_scaling_factor=1.0,
        kv_lora_rank=32,
        q_lora_rank=32,
        qk_rope_head_dim=8,
        v_head_dim=16,
        qk_nope_head_dim=16,
        topk_method="noaux_tc",
        scoring_func="sigmoid",
        norm_topk_prob=True,
        n_group=1,
        topk_group=1,
        num_experts_per_tok=2,
        moe_layer_freq=1,
        first_k_dense_replace=1,
        rope_parameters={"rope_theta": 10000.0, "rope_type": "default"},
        attention_bias=False,
    ),
    "muse_glimmer": dict(
        model_type="muse_glimmer",
        num_hidden_layers=4,  # local, local, local, global (NoPE)
        head_dim=16,
        sliding_window=6,
        qk_scale_factor=3.87,
        final_logit_softcapping=20.0,
        output_multiplier=0.5,
        tie_word_embeddings=False,
    ),
    "gpt_oss": dict(
        model_type="gpt_oss",
        num_hidden_layers=4,
        head_dim=16,
        num_local_experts=4,
        num_experts_per_tok=2,
        sliding_window=6,
        intermediate_size=64,
    ),
}


def byte_tokenizer(path: Path):
    """A real byte-level BPE tokenizer (no merges) with ChatML specials."""
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
        additional_special_tokens=["<|im_start|>"],
    )
    fast.chat_template = (
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}"
        "<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    fast.save_pretrained(str(path))


def qwen3_tokenizer(path: Path):
    path.mkdir(parents=True, exist_ok=True)
    with gzip.open(QWEN3 / "tokenizer.json.gz") as f:
        (path / "tokenizer.json").write_bytes(f.read())
    shutil.copy(QWEN3 / "tokenizer_config.json", path / "tokenizer_config.json")


def _sharpen(model, scale: float):
    # Default init makes tiny models repeat one token; larger weights give varied text.
    model.update(
        tree_map(lambda p: p * scale if p.ndim >= 2 else p, model.parameters())
    )


def make_target(
    path: Path,
    family: str,
    vocab_size: int = BYTE_VOCAB,
    seed: int = 0,
    tokenizer: str = "byte",
    **overrides,
) -> Path:
    """Write a tiny random `family` model (config.json, safetensors, tokenizer) to
    `path`."""
    from mlx_lm.utils import _get_classes

    config = {**_COMMON, **FAMILIES[family], "vocab_size": vocab_size, **overrides}
    embed_scale = config.pop("_embed_scale", None)  # gemma multiplies by sqrt(hidden)
    if tokenizer == "qwen3":
        config["eos_token_id"] = 151645
    mx.random.seed(seed)
    model_class, args_class = _get_classes(config)
    model = model_class(args_class.from_dict(config))
    _sharpen(model, 4.0)
    if embed_scale is not None:
        embed = getattr(model, "language_model", model).model.embed_tokens
        embed.weight = embed.weight * (embed_scale / 4.0)
    path.mkdir(parents=True, exist_ok=True)
    weights = dict(tree_flatten(model.parameters()))
    if config.get("tie_word_embeddings"):  # gemma3_text: tied by the missing head
        weights.pop("lm_head.weight", None)
    mx.save_safetensors(
        str(path / "model.safetensors"), weights, metadata={"format": "mlx"}
    )
    (path / "config.json").write_text(json.dumps(config, indent=2))
    (byte_tokenizer if tokenizer == "byte" else qwen3_tokenizer)(path)
    return path


def make_draft(
    path: Path,
    target_path: Path,
    num_layers: int = 2,
    block_size: int = 8,
    seed: int = 1,
    **overrides,
) -> Path:
    """Write a tiny random DFlash drafter for the target at `target_path`."""
    from dflash_mlx.models.draft import Model, ModelArgs, default_target_layer_ids

    tcfg = json.loads((target_path / "config.json").read_text())
    n_target = tcfg["num_hidden_layers"]
    args = dict(
        hidden_size=tcfg["hidden_size"],
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        intermediate_size=128,
        vocab_size=tcfg["vocab_size"],
        num_target_layers=n_target,
        target_layer_ids=default_target_layer_ids(n_target, num_layers),
        mask_token_id=tcfg["vocab_size"] - 1,
        block_size=block_size,
        rope_theta=10000.0,
        max_position_embeddings=4096,
    )
    args.update(overrides)
    margs = ModelArgs(**args)
    mx.random.seed(seed)
    if margs.architecture == "DFlash2DraftModel":
        from dflash_mlx.models.dflash2 import Model as Model2

        model = Model2(margs)
        kernels = {
            k: mx.random.normal(v.shape) * 0.3
            for k, v in tree_flatten(model.parameters())
            if k.endswith("base_kernel")
        }
        model.load_weights(list(kernels.items()), strict=False)
    else:
        model = Model(margs)
    model.update(tree_map(lambda p: p * 3.0 if p.ndim == 2 else p, model.parameters()))
    path.mkdir(parents=True, exist_ok=True)
    weights = dict(tree_flatten(model.parameters()))
    for name in (
        "predecessor_codebook",
        "successor_codebook",
    ):  # z-lab stores these bare
        key = f"candidate_selector.{name}"
        if f"{key}.weight" in weights:
            weights[key] = weights.pop(f"{key}.weight")
    mx.save_safetensors(str(path / "model.safetensors"), weights)
    (path / "config.json").write_text(json.dumps(margs.to_config(), indent=2))
    return path


def quantize_target(src: Path, dst: Path, bits: int = 4, mixed: bool = False) -> Path:
    """An mlx-community style quantized copy of a tiny target (mlx-lm's own
    quantization)."""
    from mlx_lm.utils import load_model, quantize_model

    model, config = load_model(src)

    def predicate(path, module):
        if not hasattr(module, "to_quantized"):
            return False
        if mixed and (".layers.0." in f".{path}." or "embed" in path):
            return {"group_size": 32, "bits": 8}
        return True

    model, config = quantize_model(model, config, 32, bits, quant_predicate=predicate)
    dst.mkdir(parents=True, exist_ok=True)
    mx.save_safetensors(
        str(dst / "model.safetensors"), dict(tree_flatten(model.parameters()))
    )
    (dst / "config.json").write_text(json.dumps(config, indent=2))
    for f in src.glob("*token*"):
        shutil.copy(f, dst / f.name)
    for f in src.glob("special_tokens_map.json"):
        shutil.copy(f, dst / f.name)
    return dst
