"""Loading DFlash drafters (z-lab format) from Hub ids or local folders, and checking
that one fits a target, with fix-it errors."""

from dataclasses import replace
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten

from ..backend import for_device
from ..models import draft as draft_module
from ..models.acceptance import read_acceptance
from ..models.target import Target
from .hub import resolve_path
from .targets import check_safetensors, read_config, read_safetensors

DRAFT_FILES = ["*.json", "*.safetensors"]


def _read_weights(path: Path, what: str) -> dict:
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise ValueError(
            f"{what} folder '{path}' has no *.safetensors weights; re-download it."
        )
    weights = {}
    for f in files:
        check_safetensors(f, what)
        try:
            weights.update(read_safetensors(f))
        except Exception as e:
            raise ValueError(
                f"{what} weights '{f}' cannot be read ({e}); the file is corrupt "
                "or incomplete: delete it and download again."
            ) from e
    return weights


def _drafter_args(config: dict, what: str) -> draft_module.ModelArgs:
    """The drafter's ModelArgs from its config.json, or a ValueError saying what is
    wrong with it."""
    arch = (config.get("architectures") or ["DFlashDraftModel"])[0]
    if arch not in draft_module.ARCHITECTURES:
        raise ValueError(
            f"{what} has architecture '{arch}'; supported drafters: "
            f"{', '.join(draft_module.ARCHITECTURES)}."
        )
    try:
        args = draft_module.ModelArgs.from_config(config)
    except TypeError as e:
        raise ValueError(
            f"{what} config.json lacks required fields ({e}); is it a DFlash drafter?"
        ) from e
    unknown = set(args.layer_types) - set(draft_module.LAYER_TYPES)
    if unknown or len(args.layer_types) != args.num_hidden_layers:
        raise ValueError(
            f"{what}: layer_types must list one of {draft_module.LAYER_TYPES} "
            f"per layer ({args.num_hidden_layers}), got {args.layer_types}."
        )
    if not isinstance(args.block_size, int) or args.block_size < 1:
        raise ValueError(
            f"{what}: its config.json has block_size {args.block_size!r}, but a "
            "drafter drafts blocks of at least 1 token (z-lab's use 16): fix "
            "block_size in its config.json, or download the drafter again."
        )
    if "sliding_attention" in args.layer_types and not args.sliding_window:
        raise ValueError(
            f"{what} has sliding_attention layers but no sliding_window in config.json."
        )
    return args


def _new_drafter(args: draft_module.ModelArgs, what: str) -> draft_module.Model:
    """An untrained drafter of the config's architecture (v1, or DFlash-2)."""
    if args.architecture != "DFlash2DraftModel":
        return draft_module.Model(args)
    from ..models import dflash2

    fields = ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k")
    missing = [k for k in fields if not getattr(args, k)]
    if missing:
        raise ValueError(
            f"{what} is a DFlash-2 drafter but its config lacks {missing}."
        )
    return dflash2.Model(args)


def _load_drafter_weights(model: draft_module.Model, path: Path, what: str):
    weights = model.sanitize(_read_weights(path, what))
    expected = set(dict(tree_flatten(model.parameters())))
    if "draft_vocab" in expected and "draft_vocab" not in weights:
        # exports keep it in a side file; older ones hold it as a tensor
        from ..models.draft_head import read_draft_vocab

        size = model.args.draft_vocab_size
        weights["draft_vocab"] = read_draft_vocab(path, size, what)
    missing, extra = sorted(expected - set(weights)), sorted(set(weights) - expected)
    if missing or extra:
        raise ValueError(
            f"{what} weights do not match its config: missing {missing[:5]}, "
            f"unexpected {extra[:5]}. Re-download it or fix config.json."
        )
    try:
        model.load_weights(list(weights.items()))
    except ValueError as e:
        raise ValueError(_shape_mismatch(model, weights, what) or str(e)) from e


def _shape_mismatch(model: draft_module.Model, weights: dict, what: str) -> str | None:
    """Which tensor's shape disagrees with the config, and which config field sets
    the dimension that differs (None if no shape differs)."""
    expected = dict(tree_flatten(model.parameters()))
    for name, stored in sorted(weights.items()):
        want = expected[name].shape
        if tuple(stored.shape) == tuple(want) or len(stored.shape) != len(want):
            continue
        axis = next(i for i, n in enumerate(want) if n != stored.shape[i])
        fields = [k for k, v in _config_dims(model.args).items() if v == want[axis]]
        said = " or ".join(fields) if fields else "the config"
        return (
            f"{what}: tensor {name} is stored as {tuple(stored.shape)}, but its "
            f"config.json makes it {tuple(want)} ({said} = {want[axis]}; the weights "
            f"have {stored.shape[axis]}). Restore the drafter's original config.json "
            "(or set that field to what the weights have), or download it again."
        )
    return None


def _config_dims(args: draft_module.ModelArgs) -> dict[str, int]:
    """The config's sizes, and the products of them that weight shapes use."""
    dims = {k: v for k, v in vars(args).items() if type(v) is int}
    heads, kv, head_dim = (
        args.num_attention_heads,
        args.num_key_value_heads,
        args.head_dim,
    )
    dims["num_attention_heads × head_dim"] = heads * (head_dim or 0)
    dims["num_key_value_heads × head_dim"] = kv * (head_dim or 0)
    dims["len(target_layer_ids) × hidden_size"] = (
        len(args.target_layer_ids) * args.hidden_size
    )
    return dims


def _drafter_dtype(model: draft_module.Model, kernels):
    stored = model.dtype
    if mx.default_device() == mx.cpu and stored != mx.float32:
        model.set_dtype(mx.float32)  # MLX's CPU half-precision matmuls are ~10x slower
        if kernels.half_weights:  # native products read them as stored: half the bytes
            for layer in model.projections():
                layer.set_dtype(stored)
    elif stored == mx.float16:
        # float16 activations overflow in the feature fusion (0% acceptance); bfloat16
        # has float32's range.
        model.set_dtype(mx.bfloat16)


def _quantize_drafter(model: draft_module.Model, bits: int, group_size: int):
    nn.quantize(
        model,
        group_size,
        bits,
        class_predicate=lambda p, m: (
            isinstance(m, nn.Linear)
            and m.weight.shape[-1] % group_size == 0
            and not p.startswith("candidate_selector")
        ),
    )


# The drafter's context by default: drafters are trained on sequences of at most 3,072
# tokens (the paper's recipe), so no key farther back is one they learnt to read; a
# bound also keeps a block's cost flat as the context grows (docs/benchmarks.md).
DEFAULT_CONTEXT_WINDOW = 3072


def _check_draft_options(bits, group_size, sliding_window_size):
    if bits not in (None, 2, 3, 4, 5, 6, 8):
        raise ValueError(f"bits must be one of 2, 3, 4, 5, 6, 8 (or None), got {bits}.")
    if group_size not in (32, 64, 128):
        raise ValueError(f"group_size must be 32, 64 or 128, got {group_size!r}.")
    if sliding_window_size not in (None, "auto") and (
        isinstance(sliding_window_size, bool)
        or not isinstance(sliding_window_size, int)
        or sliding_window_size < 1
    ):
        raise ValueError(
            "sliding_window_size must be a positive number of tokens, 'auto' (the "
            f"last {DEFAULT_CONTEXT_WINDOW}) or None (the whole context), got "
            f"{sliding_window_size!r}."
        )


def load_draft(
    path_or_repo: str | None = None,
    target=None,
    *,
    bits: int | None = None,
    group_size: int = 64,
    sliding_window_size: int | str | None = "auto",
    distributed=None,
) -> draft_module.Model:
    """Load a DFlash drafter (z-lab format; with no argument, the built-in default's).

    With `target`, also check that it fits it. `bits` (4 or 8) quantizes its linear
    layers; `sliding_window_size` bounds the context each layer keeps (drafts, speed
    and memory; never the output): "auto" keeps the last DEFAULT_CONTEXT_WINDOW
    tokens, None all of them. With `distributed` (a Group), every rank must load the
    same drafter (each holds a full copy).
    """
    if path_or_repo is None:
        from .defaults import default_draft

        path_or_repo = default_draft()
        if path_or_repo is None:
            raise ValueError(
                "The built-in default target has no drafter yet: pass a drafter path."
            )
    _check_draft_options(bits, group_size, sliding_window_size)
    what = f"Drafter '{path_or_repo}'"
    path = resolve_path(path_or_repo, DRAFT_FILES, "Drafter")
    if distributed is not None:
        from ..distributed import file_digest

        distributed.check_same("drafter", file_digest(path))
    config = read_config(path, what)
    model = _new_drafter(_drafter_args(config, what), what)
    stored_quant = config.get("quantization")
    if stored_quant:  # an already-quantized checkpoint (mlx-community style)
        nn.quantize(
            model,
            stored_quant["group_size"],
            stored_quant["bits"],
            class_predicate=lambda p, m: isinstance(m, nn.Linear),
        )
    _load_drafter_weights(model, path, what)
    kernels = for_device()
    _drafter_dtype(
        model, kernels if bits is None else replace(kernels, half_weights=False)
    )
    if bits is not None and not stored_quant:
        _quantize_drafter(model, bits, group_size)
    model.eval()
    model.use_kernels(kernels)
    mx.eval(model.parameters())
    model.name_or_path = str(path_or_repo)
    window = sliding_window_size  # "auto" (checked above), a size, or None
    model.context_window = DEFAULT_CONTEXT_WINDOW if isinstance(window, str) else window
    # what "auto" starts from (models/acceptance.py); None for drafters trained
    # elsewhere
    model.acceptance_prior = read_acceptance(path, what)
    if target is not None:
        check_compatible(target, model)
    return model


def check_compatible(target, draft):
    """Raise a ValueError naming both models if `draft` cannot serve `target`."""
    if not isinstance(target, Target) or target.feature_layer_ids:
        target = Target(target.model if isinstance(target, Target) else target)
    d, t = draft.args, target
    dname = getattr(draft, "name_or_path", "the drafter")
    tname = getattr(target.model, "name_or_path", f"the {t.model_type} target")
    fix = (
        f"use the DFlash drafter trained for {tname}, or the target {dname} was "
        "trained for"
    )
    problems = []
    if d.hidden_size != t.hidden_size:
        problems.append(f"hidden size {d.hidden_size} vs {t.hidden_size}")
    if d.vocab_size != t.vocab_size:
        problems.append(f"vocabulary {d.vocab_size} vs {t.vocab_size}")
    if d.num_target_layers != t.num_layers:
        problems.append(
            f"drafter expects {d.num_target_layers} target layers, target has "
            f"{t.num_layers}"
        )
    if any(not 0 <= i < t.num_layers for i in d.target_layer_ids):
        problems.append(
            f"target_layer_ids {d.target_layer_ids} outside 0..{t.num_layers - 1}"
        )
    if not 0 <= d.mask_token_id < t.vocab_size:
        problems.append(
            f"mask_token_id {d.mask_token_id} outside the target vocabulary"
        )
    vocab = getattr(draft, "draft_vocab", None)
    if (
        vocab is not None
        and vocab.size
        and not (0 <= vocab.min().item() and vocab.max().item() < t.vocab_size)
    ):
        problems.append(
            f"draft vocabulary ids outside the target vocabulary 0..{t.vocab_size - 1}"
        )
    if problems:
        raise ValueError(
            f"Drafter {dname} does not fit target {tname}: "
            + "; ".join(problems)
            + f". Fix: {fix}."
        )
