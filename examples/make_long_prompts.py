"""Write long-context benchmark prompts: worked gsm8k-train problems as context, then a
new gsm8k-test question to solve in the same way.

    python examples/make_long_prompts.py --out long.jsonl # 4.6K-5.7K tokens each
    dflash-mlx bench --dataset long.jsonl --max-tokens 128

This is the shape of the "speculation collapses past 4K tokens" reports: a long pasted
context the drafter never saw in training. The solved problems come from the training
split (the calculator annotations `<<48/2=24>>` removed), the questions from the test
split, so the prompts never repeat a benchmark item's answer.
"""

import argparse
import json
import random
import re
from pathlib import Path

from dflash_mlx.datasets import DATA_DIR, read_jsonl_gz  # the package's bundled sets


def worked(row: dict) -> str:
    steps, final = row["answer"].rsplit("####", 1)
    steps = re.sub(r"<<[^>]*>>", "", steps).strip()
    return f"Problem: {row['question']}\nSolution: {steps}\nAnswer: {final.strip()}"


def long_prompt(examples: list[dict], question: str) -> str:
    solved = "\n\n".join(worked(r) for r in examples)
    return (
        "Here are solved math word problems.\n\n"
        f"{solved}\n\n"
        "Solve the next problem the same way, step by step, and end with the answer.\n"
        f"Problem: {question}"
    )


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--count", type=int, default=4, help="Prompts to write.")
    parser.add_argument("--problems", type=int, default=30, help="Solved per prompt.")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if args.out.exists():
        raise SystemExit(f"{args.out} exists; pass another --out or remove it first.")
    train = read_jsonl_gz(DATA_DIR / "train_gsm8k.jsonl.gz")
    test = read_jsonl_gz(DATA_DIR / "gsm8k_test.jsonl.gz")
    rng = random.Random(args.seed)
    with args.out.open("w") as f:
        for i in range(args.count):
            prompt = long_prompt(rng.sample(train, args.problems), test[i]["question"])
            f.write(json.dumps({"id": f"long-{i}", "prompt": prompt}) + "\n")
    print(
        f"wrote {args.count} prompts ({args.problems} solved problems each): {args.out}"
    )


if __name__ == "__main__":
    main()
