"""A new drafter shaped for a target, and its export in the z-lab folder format."""

import json
import os
from pathlib import Path

import mlx.core as mx
from mlx.utils import tree_flatten

from .. import files
from ..loading import read_safetensors
from ..models.acceptance import ACCEPTANCE_FILE, write_acceptance
from ..models.draft import Model, ModelArgs, default_target_layer_ids
from ..models.draft_head import DRAFT_VOCAB_FILE, write_draft_vocab

DEFAULT_DRAFT_LAYERS = 3
DEFAULT_FEATURE_LAYERS = 5
DEFAULT_BLOCK_SIZE = 16


def _target_args(target):
    return getattr(target.lm, "args", None) or getattr(target.model, "args", None)


def new_drafter_args(
    target,
    num_layers: int = DEFAULT_DRAFT_LAYERS,
    block_size: int = DEFAULT_BLOCK_SIZE,
    target_layer_ids: list | None = None,
    mask_token_id: int | None = None,
    sliding_window: int = 0,
) -> ModelArgs:
    """Drafter arguments for `target` (a `dflash_mlx.Target`): its hidden size, heads
    and MLP width, `num_layers` Qwen3-style layers, features from `target_layer_ids`
    (default: 5 layers spread over the target, the z-lab convention).

    `sliding_window` W > 0 makes every layer a sliding one that sees only the last W
    context positions (the block itself stays bidirectional): with RoPE, its inputs then
    look the same at any prompt length, so it does not collapse past the lengths it was
    trained on."""
    if num_layers < 1:
        raise ValueError(f"--draft-layers must be at least 1, got {num_layers}.")
    if block_size < 2:
        raise ValueError(f"--block-size must be at least 2, got {block_size}.")
    t = _target_args(target)
    L, H = target.num_layers, target.hidden_size
    heads = getattr(t, "num_attention_heads", None) or max(1, H // 64)
    if target_layer_ids is None:
        n = min(DEFAULT_FEATURE_LAYERS, L)
        target_layer_ids = sorted(set(default_target_layer_ids(L, n)))
    bad = [i for i in target_layer_ids if not 0 <= i < L]
    if bad:
        raise ValueError(
            f"Target layer ids {bad} are outside 0..{L - 1} for this target."
        )
    vocab = target.vocab_size
    mask = vocab - 1 if mask_token_id is None else int(mask_token_id)
    if not 0 <= mask < vocab:
        raise ValueError(
            f"--mask-token-id {mask} is outside the target vocabulary (0..{vocab - 1})."
        )
    if sliding_window and sliding_window <= block_size:
        raise ValueError(
            f"--sliding-window {sliding_window} must exceed the block size "
            f"{block_size}, or be 0 (full attention)."
        )
    kind = "sliding_attention" if sliding_window else "full_attention"
    rope = getattr(t, "rope_scaling", None)
    return ModelArgs(
        hidden_size=H,
        num_hidden_layers=num_layers,
        num_attention_heads=heads,
        num_key_value_heads=getattr(t, "num_key_value_heads", None) or heads,
        head_dim=getattr(t, "head_dim", None) or H // heads,
        intermediate_size=getattr(t, "intermediate_size", None) or 4 * H,
        vocab_size=vocab,
        num_target_layers=L,
        target_layer_ids=list(target_layer_ids),
        mask_token_id=mask,
        rms_norm_eps=float(getattr(t, "rms_norm_eps", 1e-6)),
        rope_theta=float(getattr(t, "rope_theta", 10000.0)),
        rope_scaling=rope if isinstance(rope, dict) else None,
        max_position_embeddings=int(
            getattr(t, "max_position_embeddings", 32768) or 32768
        ),
        block_size=block_size,
        layer_types=[kind] * num_layers,
        sliding_window=sliding_window or None,
        is_causal=False if sliding_window else None,
    )


def new_drafter(args: ModelArgs, seed: int = 0) -> Model:
    mx.random.seed(seed)
    model = Model(args)
    mx.eval(model.parameters())
    return model


def _layer_index(name: str) -> int | None:
    parts = name.split(".")
    return int(parts[1]) if parts[0] == "layers" else None


def init_weights(model: Model, path: Path) -> list[int]:
    """Start `model` from another drafter's weights: a drafter folder or a checkpoint.

    Shapes must match (same target); block size and draft vocabulary may differ, since
    neither changes a weight. `model` may have more layers than the donor: the extra
    ones come last and start as the identity (their attention and MLP output
    projections are zero), so the grown drafter begins exactly where the donor stood
    and training decides what the new layers add. Returns the new layers' indices.
    """
    files = (
        [path]
        if path.is_file()
        else [path / "model.safetensors", path / "drafter.safetensors"]
    )
    file = next((f for f in files if f.is_file()), None)
    if file is None:
        raise ValueError(
            f"--init-from {path}: no model.safetensors or drafter.safetensors there."
        )
    mine = dict(tree_flatten(model.parameters()))
    theirs = {k: v for k, v in read_safetensors(file).items() if k != "draft_vocab"}
    donor_layers = 1 + max(
        (i for i in map(_layer_index, theirs) if i is not None), default=-1
    )
    new = list(range(donor_layers, len(model.layers)))
    bad = sorted(
        k for k, v in theirs.items() if k not in mine or mine[k].shape != v.shape
    )
    missing = sorted(
        k
        for k in mine
        if k not in theirs and k != "draft_vocab" and _layer_index(k) not in new
    )
    if bad or missing or donor_layers == 0:
        raise ValueError(
            f"--init-from {path} does not fit this drafter (differs in "
            f"{(bad + missing)[:3]}): use the same target, and --draft-layers at "
            "least the donor's."
        )
    model.load_weights(
        [(k, v.astype(mine[k].dtype)) for k, v in theirs.items()], strict=False
    )
    for i in new:
        layer = model.layers[i]
        layer.self_attn.o_proj.weight = mx.zeros_like(layer.self_attn.o_proj.weight)
        layer.mlp.down_proj.weight = mx.zeros_like(layer.mlp.down_proj.weight)
    mx.eval(model.parameters())
    return new


def save_weights(model: Model, file: Path, dtype=None, exclude: tuple = ()):
    weights = dict(tree_flatten(model.parameters()))
    for name in exclude:
        weights.pop(name, None)
    if dtype is not None:
        weights = {
            k: v.astype(dtype) if mx.issubdtype(v.dtype, mx.floating) else v
            for k, v in weights.items()
        }
    tmp = file.with_name(f".{file.stem}.tmp.safetensors")
    mx.save_safetensors(str(tmp), weights, metadata={"format": "mlx"})
    os.replace(tmp, file)


def export_drafter(
    model: Model, out: Path, card: dict, dtype=None, acceptance=None
) -> Path:
    """Write config.json, model.safetensors and a README.md model card to `out`, and
    beside them what other runtimes ignore: the draft vocabulary (draft_vocab.json,
    kept out of the safetensors, which they load strictly) and the measured
    per-position acceptance (acceptance.json, the adaptive policy's prior)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    config = model.args.to_config()
    if dtype is not None:
        config["torch_dtype"] = {mx.float16: "float16", mx.bfloat16: "bfloat16"}.get(
            dtype, "float32"
        )
    save_weights(model, out / "model.safetensors", dtype, exclude=("draft_vocab",))
    vocab = getattr(model, "draft_vocab", None)
    (out / DRAFT_VOCAB_FILE).unlink(missing_ok=True)  # another run's, if any
    if vocab is not None:
        write_draft_vocab(out, vocab.tolist())
    (out / ACCEPTANCE_FILE).unlink(missing_ok=True)
    if acceptance is not None:
        write_acceptance(out, acceptance)
    files.write_text(out / "config.json", json.dumps(config, indent=2))
    files.write_text(out / "README.md", model_card(model.args, card))
    return out


def _card_rows(args: ModelArgs, card: dict) -> list[tuple[str, str]]:
    tau = card.get("tau")
    tau_line = (
        f"{tau:.2f} (greedy, block {args.block_size}, on "
        f"{card.get('val_prompts', '?')} held-out prompts, measured during training)"
        if tau
        else "not measured"
    )
    vocab = (
        f"draft vocabulary {args.draft_vocab_size} tokens"
        if args.draft_vocab_size
        else "full vocabulary"
    )
    return [
        ("target", f"{card.get('target', '?')} ({args.num_target_layers} layers)"),
        (
            "data",
            f"{card.get('data', '?')}: {card.get('samples', '?')} responses "
            "regenerated by the target",
        ),
        (
            "drafter",
            f"{args.num_hidden_layers} layers, block size {args.block_size}, target "
            f"layers {args.target_layer_ids}, mask token {args.mask_token_id}, {vocab}",
        ),
        (
            "training",
            f"{card.get('steps', '?')} steps × {card.get('batch', '?')} sequences, "
            f"lr {card.get('lr', '?')}, {card.get('train_time', '?')}",
        ),
        ("acceptance length τ", tau_line),
    ]


def model_card(args: ModelArgs, card: dict) -> str:
    target = card.get("target", "?")
    usage = card.get("target", "TARGET")
    table = "\n".join(f"| {name} | {value} |" for name, value in _card_rows(args, card))
    return f"""---
library_name: mlx
tags: [dflash, speculative-decoding, mlx]
base_model: {target}
---
# DFlash drafter for {target}

Trained with `dflash-mlx train` (block-diffusion drafter, KV injection of target
features).

| | |
|---|---|
{table}

```bash
dflash-mlx chat --model {usage} --draft PATH_TO_THIS_FOLDER
```

```python
from dflash_mlx import load, load_draft, stream_generate
model, tokenizer = load("{usage}")
draft = load_draft("PATH_TO_THIS_FOLDER")
```
"""
