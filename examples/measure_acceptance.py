"""Measure a drafter's per-position acceptance and write its acceptance.json (the
adaptive block size's prior, see docs/policy.md).

    python examples/measure_acceptance.py            # the shipped default drafter
    python examples/measure_acceptance.py runs/my-drafter --target MODEL

Greedy answers at the drafter's block size to the prompts `dflash-mlx train` held out
(the same split: `--prompts`, `--val-prompts`, `--seed` as in training; by default the
16 prompts the shipped drafter's training held out of its four prompt sets), never a
benchmark's test set.
The default drafter's file goes into the package folder, beside its weights.
"""

import argparse
from pathlib import Path

from dflash_mlx.loading.defaults import DRAFT_NAME, DRAFTERS_DIR
from dflash_mlx.models.acceptance import write_acceptance
from dflash_mlx.train.loop import measure_acceptance


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "drafter", nargs="?", type=Path, help="Default: the shipped one."
    )
    parser.add_argument("--target", help="Default: the built-in target.")
    parser.add_argument(  # the sets the shipped drafter was trained on, in order
        "--prompts",
        nargs="+",
        default=[
            "bundled:gsm8k-train",
            "bundled:code-train",
            "bundled:mbpp-train",
            "bundled:chat-train",
        ],
    )
    parser.add_argument("--val-prompts", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-tokens", type=int, default=128)
    args = parser.parse_args()

    from dflash_mlx import load, load_draft
    from dflash_mlx.train.data import encode_chat
    from dflash_mlx.train.pipeline import prompt_sets

    model, tokenizer = load(args.target)
    draft = load_draft(str(args.drafter) if args.drafter else None, target=model)
    _, held_out = prompt_sets(args.prompts, args.val_prompts, args.seed)
    ids = [encode_chat(tokenizer, p.messages) for p in held_out]
    source = (
        f"{len(ids)} held-out prompts of {', '.join(args.prompts)} (seed {args.seed}), "
        f"greedy, block {draft.args.block_size}, up to {args.max_tokens} tokens"
    )
    acceptance = measure_acceptance(
        model, draft, tokenizer, ids, draft.args.block_size, args.max_tokens, source
    )
    out = args.drafter or DRAFTERS_DIR / DRAFT_NAME
    write_acceptance(out, acceptance)
    rates = ", ".join("-" if r is None else f"{r:.2f}" for r in acceptance.rates())
    print(f"tau {acceptance.tau:.2f}; acceptance by position {rates} -> {out}")


if __name__ == "__main__":
    main()
