"""Checks of a training run's settings, all made before the target loads: a bad value
fails in a second, not after an hour of data generation.

`check_config` and `check_options` look at values only (the dataclasses call them when
built); `check_out` and `check_init_from` look at the disk (`run` calls them first).
"""

from pathlib import Path

from .. import files, validate

FEATURE_MODES = ("auto", "cache", "fly")
# what a run of ours leaves in its folder, and what its export writes there
RUN_MARKERS = ("data/meta.json", "checkpoints", "features")
EXPORTED = ("config.json", "model.safetensors", "README.md")
INIT_FILES = ("model.safetensors", "drafter.safetensors")


def _int(name: str, value, low: int, meaning: str = "") -> None:
    if not validate.is_int(value) or value < low:
        extra = f" ({meaning})" if meaning else ""
        raise ValueError(f"{name} must be an integer >= {low}{extra}, got {value!r}.")


def _number(name: str, value, low: float, inclusive: bool = True, high=None):
    number = validate.finite(name, value)
    below = number < low if inclusive else number <= low
    if below or (high is not None and number >= high):
        bound = f"{'>=' if inclusive else '>'} {low:g}"
        bound += f" and < {high:g}" if high is not None else ""
        raise ValueError(f"{name} must be {bound}, got {value!r}.")


def check_config(cfg) -> None:
    """A `TrainConfig`'s values (the CLI's flag names in the messages)."""
    _int("--steps", cfg.steps, 0, "0: from --epochs")
    if not cfg.steps:
        _number("--epochs", cfg.epochs, 0, inclusive=False)
    _int("--batch-size", cfg.batch_size, 1)
    _int("--anchors", cfg.anchors, 1)
    _number("--lr", cfg.lr, 0, inclusive=False)
    _number("--warmup", cfg.warmup, 0, high=1)
    _number("--weight-decay", cfg.weight_decay, 0)
    _number("--clip", cfg.clip, 0, inclusive=False)
    if cfg.gamma is not None:
        _number("--gamma", cfg.gamma, 0, inclusive=False)
    validate.seed(cfg.seed)
    _int("--val-every", cfg.val_every, 0, "0: at the end only")
    _int("--val-max-tokens", cfg.val_max_tokens, 1)
    _int("--save-every", cfg.save_every, 0, "0: at the end only")
    _int("keep_checkpoints", cfg.keep_checkpoints, 1)


def check_options(opts) -> None:
    """A `TrainOptions`' values, before anything is read or loaded."""
    if not opts.prompts:
        raise ValueError("--prompts needs at least one prompt set or .jsonl file.")
    _int("--max-prompts", opts.max_prompts, 0, "0: all")
    _int("--val-prompts", opts.val_prompts, 0)
    _int("--draft-layers", opts.draft_layers, 1)
    _int("--block-size", opts.block_size, 2)
    if opts.target_layer_ids is not None:
        if not opts.target_layer_ids:
            raise ValueError("--target-layers needs at least one layer number.")
        for i in opts.target_layer_ids:
            _int("--target-layers", i, 0)
    if opts.mask_token_id is not None:
        _int("--mask-token-id", opts.mask_token_id, 0)
    _int("--sliding-window", opts.sliding_window, 0, "0: full attention")
    _int("--max-new-tokens", opts.max_new_tokens, 1)
    _int("--max-len", opts.max_len, 2)
    _int("--gen-batch-size", opts.gen_batch_size, 1)
    _number("--temperature", opts.temperature, 0)
    if opts.features not in FEATURE_MODES:
        raise ValueError(
            f"--features must be auto, cache or fly, not '{opts.features}'."
        )
    _number("--feature-budget-gb", opts.feature_budget_gb, 0)
    _int("--draft-vocab", opts.draft_vocab, 0, "0: the whole vocabulary")


def check_out(out, force: bool = False) -> Path:
    """The run folder: writable, and never someone else's model unless `force`."""
    path = files.check_folder(out, "--out")
    ours = any((path / m).exists() for m in RUN_MARKERS)
    theirs = [f for f in EXPORTED if (path / f).exists()]
    if theirs and not ours and not force:
        raise ValueError(
            f"--out '{path}' already holds {', '.join(theirs)} and is not a "
            "dflash-mlx training run: training would replace them. Choose a new "
            "folder, or pass --force to write into it anyway."
        )
    return path


def check_init_from(path) -> Path | None:
    """The weights file `--init-from` names (a file, or a folder holding one)."""
    if path is None:
        return None
    path = Path(path).expanduser()
    if path.is_file():
        return path
    found = next((path / f for f in INIT_FILES if (path / f).is_file()), None)
    if found is None:
        raise ValueError(
            f"--init-from {path}: no model.safetensors or drafter.safetensors there; "
            "pass a drafter folder, a checkpoint folder or a .safetensors file."
        )
    return found
