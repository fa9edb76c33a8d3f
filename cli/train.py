"""`dflash-mlx train`: train a DFlash drafter for a target on its own responses."""

from pathlib import Path

import typer


def _layer_ids(text: str | None) -> list | None:
    if not text:
        return None
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(
            f"--target-layers takes comma-separated layer numbers, e.g. 1,8,15,22,29; "
            f"got '{text}'."
        ) from None


def train(
    target: str = typer.Option(
        ..., "--target", "-m", help="Target: Hub id, folder or .gguf file."
    ),
    out: Path = typer.Option(
        ..., "--out", "-o", help="Run folder; the drafter is written here."
    ),
    prompts: list[str] = typer.Option(
        ["bundled:gsm8k-train"],
        "--prompts",
        "-p",
        help="bundled:gsm8k-train, bundled:mbpp-train, bundled:code-train, "
        "bundled:code-train-2, bundled:chat-train, bundled:chat-train-2 or a .jsonl "
        "file (repeat to mix).",
    ),
    max_prompts: int = typer.Option(
        0, "--max-prompts", help="Use only this many training prompts (0 = all)."
    ),
    val_prompts: int = typer.Option(
        16, "--val-prompts", help="Held-out prompts for the τ check."
    ),
    draft_layers: int = typer.Option(
        3, "--draft-layers", help="Drafter decoder layers."
    ),
    block_size: int = typer.Option(
        16, "--block-size", "-b", help="Block size B (train 16, use ≤16)."
    ),
    target_layers: str | None = typer.Option(
        None,
        "--target-layers",
        help="Target layers fed to the drafter, e.g. 1,8,15,22,29 "
        "(default: 5 spread over the target).",
    ),
    mask_token_id: int | None = typer.Option(
        None, "--mask-token-id", help="Mask token id (default: the last vocabulary id)."
    ),
    sliding_window: int = typer.Option(
        0,
        "--sliding-window",
        help="Draft layers see only the last N context positions (0: all); keeps "
        "drafts good on prompts longer than the training ones.",
    ),
    max_new_tokens: int = typer.Option(
        256, "--max-new-tokens", help="Response length cap."
    ),
    max_len: int = typer.Option(
        3072, "--max-len", help="Prompt + response length cap."
    ),
    gen_batch_size: int = typer.Option(
        32, "--gen-batch-size", help="Prompts generated together."
    ),
    temperature: float = typer.Option(
        0.0, "--temperature", help="Response sampling (0 = greedy)."
    ),
    features: str = typer.Option(
        "auto", "--features", help="auto, cache (on disk) or fly (recompute)."
    ),
    feature_budget_gb: float = typer.Option(
        20.0, "--feature-budget-gb", help="Disk budget for auto."
    ),
    epochs: float = typer.Option(
        6.0, "--epochs", help="Passes over the data (ignored with --steps)."
    ),
    steps: int = typer.Option(
        0, "--steps", help="Optimizer steps (0 = from --epochs)."
    ),
    batch_size: int = typer.Option(
        4, "--batch-size", help="Sequences per step (accumulated)."
    ),
    anchors: int = typer.Option(64, "--anchors", help="Blocks per sequence per step."),
    lr: float = typer.Option(6e-4, "--lr", help="Peak AdamW learning rate."),
    warmup: float = typer.Option(
        0.04, "--warmup", help="Warm-up fraction of the steps."
    ),
    weight_decay: float = typer.Option(0.01, "--weight-decay"),
    clip: float = typer.Option(1.0, "--clip", help="Gradient-norm clip."),
    gamma: float | None = typer.Option(
        None, "--gamma", help="Loss decay (default by block size)."
    ),
    seed: int = typer.Option(0, "--seed"),
    val_every: int = typer.Option(
        250, "--val-every", help="Steps between τ checks (0 = end only)."
    ),
    val_max_tokens: int = typer.Option(128, "--val-max-tokens"),
    save_every: int = typer.Option(
        250, "--save-every", help="Steps between checkpoints."
    ),
    draft_vocab: int = typer.Option(
        0,
        "--draft-vocab",
        help="Draft vocabulary: the N tokens the target uses most "
        "(0 = all; 4096 makes the head ~12× cheaper on a 49K vocab).",
    ),
    init_from: Path | None = typer.Option(
        None, "--init-from", help="Start from this drafter or checkpoint folder."
    ),
    corpus: Path | None = typer.Option(
        None,
        "--corpus",
        help="A folder of responses kept across runs: take the ones it has, generate "
        "the rest, write them all back (e.g. corpus/smollm2-135m-instruct).",
    ),
    generate: bool = typer.Option(
        True,
        "--generate/--no-generate",
        help="--no-generate: train only on the responses --corpus (or the run) "
        "already holds for the prompts.",
    ),
    force: bool = typer.Option(
        False,
        "--force",
        help="Write into an --out folder that holds another model (replacing its "
        "config.json, model.safetensors and README.md).",
    ),
):
    """Train a DFlash drafter for TARGET; rerun the same command to resume."""
    from dflash_mlx.train import TrainConfig, TrainOptions, check

    from . import errors
    from . import train_ui as ui

    err = ui.console(stderr=True)
    with errors.usage(err):
        config = TrainConfig(
            steps=steps,
            epochs=epochs,
            batch_size=batch_size,
            anchors=anchors,
            lr=lr,
            warmup=warmup,
            weight_decay=weight_decay,
            clip=clip,
            gamma=gamma,
            seed=seed,
            val_every=val_every,
            val_max_tokens=val_max_tokens,
            save_every=save_every,
        )
        opts = TrainOptions(
            target=target,
            out=out,
            prompts=list(prompts),
            max_prompts=max_prompts,
            val_prompts=val_prompts,
            draft_layers=draft_layers,
            block_size=block_size,
            target_layer_ids=_layer_ids(target_layers),
            mask_token_id=mask_token_id,
            sliding_window=sliding_window,
            max_new_tokens=max_new_tokens,
            max_len=max_len,
            gen_batch_size=gen_batch_size,
            temperature=temperature,
            features=features,
            feature_budget_gb=feature_budget_gb,
            draft_vocab=draft_vocab,
            init_from=init_from,
            corpus=corpus,
            generate=generate,
            train=config,
            force=force,
        )
        check(opts)
    try:
        with errors.runtime(err):
            ui.render(opts)
    except KeyboardInterrupt:
        ui.interrupted(err, out)
        raise typer.Exit(130) from None
