"""A small random-weight target and DFlash drafter on disk, for the examples that
measure the engine rather than a real model (nothing to download).

    from random_pair import make_pair
    target_dir, draft_dir = make_pair(Path("/tmp/pair"), "qwen3", hidden=256, layers=8)

Both load with `dflash_mlx.load` / `dflash_mlx.load_draft`. The tokenizer is byte-level
(every byte one token) with a ChatML template. With random weights the drafter is
rarely accepted (tau ~ 1): what is measured is the engine, not speculation.
"""

import importlib
import json
from pathlib import Path

import mlx.core as mx
from mlx.utils import tree_flatten, tree_map

FAMILIES = {
    "llama": dict(model_type="llama", tie_word_embeddings=True),
    "qwen3": dict(model_type="qwen3", head_dim=16, tie_word_embeddings=True),
    "qwen3_5": dict(
        model_type="qwen3_5",
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
}
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>"
    "\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def _save(model, path: Path, config: dict):
    # default init makes small models repeat one token; larger weights vary the text
    model.update(tree_map(lambda p: p * 3.0 if p.ndim >= 2 else p, model.parameters()))
    path.mkdir(parents=True, exist_ok=True)
    weights = dict(tree_flatten(model.parameters()))
    mx.save_safetensors(str(path / "model.safetensors"), weights)
    (path / "config.json").write_text(json.dumps(config, indent=2))


def _byte_tokenizer(path: Path):
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
    fast.chat_template = CHATML
    fast.save_pretrained(str(path))


def make_target(path: Path, family: str, hidden: int, layers: int, **overrides) -> Path:
    """A random `family` target (mlx-lm's own model class) with a byte tokenizer."""
    config = dict(
        hidden_size=hidden,
        intermediate_size=hidden * 3,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        rms_norm_eps=1e-6,
        max_position_embeddings=4096,
        rope_theta=10000.0,
        vocab_size=4096,
        **FAMILIES[family],
    )
    config.update(overrides)
    module = importlib.import_module(f"mlx_lm.models.{config['model_type']}")
    mx.random.seed(0)
    _save(module.Model(module.ModelArgs.from_dict(config)), path, config)
    _byte_tokenizer(path)
    return path


def make_draft(path: Path, target: Path, layers: int = 2, block_size: int = 16, **kw):
    """A random DFlash drafter that fits the target at `target`."""
    from dflash_mlx.models.draft import Model, ModelArgs, default_target_layer_ids

    tcfg = json.loads((target / "config.json").read_text())
    n_target = tcfg["num_hidden_layers"]
    args = ModelArgs(
        **{
            "hidden_size": tcfg["hidden_size"],
            "num_hidden_layers": layers,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 16,
            "intermediate_size": tcfg["intermediate_size"],
            "vocab_size": tcfg["vocab_size"],
            "num_target_layers": n_target,
            "target_layer_ids": default_target_layer_ids(n_target, layers),
            "mask_token_id": tcfg["vocab_size"] - 1,
            "block_size": block_size,
            "rope_theta": 10000.0,
            "max_position_embeddings": tcfg["max_position_embeddings"],
            **kw,
        }
    )
    mx.random.seed(1)
    _save(Model(args), path, args.to_config())
    return path


def make_pair(
    root: Path,
    family: str = "qwen3",
    hidden: int = 256,
    layers: int = 8,
    block_size: int = 16,
    **target_config,
) -> tuple[str, str]:
    """(target folder, drafter folder) under `root`; `target_config` overrides the
    target's config.json (e.g. vocab_size, intermediate_size)."""
    target = make_target(root / "target", family, hidden, layers, **target_config)
    draft = make_draft(root / "draft", target, block_size=block_size)
    return str(target), str(draft)
