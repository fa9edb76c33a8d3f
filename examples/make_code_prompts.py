"""Write the bundled `code-train` prompt set from the Python standard library.

    python examples/make_code_prompts.py [--max 1000]

Every public pure-Python function of the stdlib with a one-line summary in its
docstring becomes two coding prompts, in the two shapes the benchmark's code sets use
(HumanEval's "complete this signature and docstring", MBPP's "Write a python function
to ..."), so a drafter for a small target sees code answers in training without
touching the benchmark's test splits. Only the prompts come from here: the target writes
the responses. Output: dflash_mlx/data/train_code.jsonl.gz (deterministic).
"""

import argparse
import gzip
import importlib
import inspect
import json
import pkgutil
import random
import sys
import warnings
from pathlib import Path

OUT = Path(__file__).parents[1] / "dflash_mlx" / "data" / "train_code.jsonl.gz"
SKIP = ("test", "idlelib", "tkinter", "turtle", "lib2to3", "ensurepip", "pydoc_data",
        "this", "antigravity", "venv", "__main__")  # fmt: skip


def _summary(func) -> str | None:
    doc = inspect.getdoc(func) or ""
    first = doc.strip().split("\n\n")[0].replace("\n", " ").strip()
    if (
        not 25 <= len(first) <= 160
        or not first[0].isupper()
        or "deprecated" in first.lower()
    ):
        return None
    return first if first.endswith(".") else first + "."


def _module_names():
    """Top-level stdlib modules and the public submodules of its packages."""
    for info in sorted(pkgutil.iter_modules(), key=lambda m: m.name):
        name = info.name
        if name.startswith("_") or name in SKIP or name not in sys.stdlib_module_names:
            continue
        yield name
        if info.ispkg:
            try:
                package = importlib.import_module(name)
            except Exception:
                continue
            for sub in pkgutil.iter_modules(package.__path__, f"{name}."):
                if not sub.name.rsplit(".", 1)[-1].startswith("_"):
                    yield sub.name


def _functions():
    seen = set()
    for name in _module_names():
        if any(part in SKIP for part in name.split(".")):
            continue
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                module = importlib.import_module(name)
        except Exception:
            continue
        for fname, func in sorted(vars(module).items()):
            if fname.startswith("_") or not inspect.isfunction(func):
                continue
            if func.__module__ != name or fname in seen:
                continue
            summary = _summary(func)
            try:
                signature = str(inspect.signature(func))
            except (TypeError, ValueError):
                continue
            if summary and len(signature) < 80 and "<" not in signature:
                seen.add(fname)
                yield name, fname, signature, summary


def _prompt(shape: str, fname: str, signature: str, summary: str) -> str:
    if shape == "humaneval":
        return (
            "Write a solution to the following problem and make sure that it passes "
            f"the tests:\n```python\ndef {fname}{signature}:\n"
            f'    """{summary}\n    """\n```'
        )
    task = summary[0].lower() + summary[1:].rstrip(".")
    return f"Write a python function to {task}."


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--max", type=int, default=1000, help="functions to use")
    args = parser.parse_args()
    found = list(_functions())
    random.Random(0).shuffle(found)
    rows, seen = [], set()
    for module, fname, sig, summary in found[: args.max]:
        verb = summary.split()[0].lower() not in ("a", "an", "the", "this", "if")
        for shape in ("humaneval", "mbpp") if verb else ("humaneval",):
            prompt = _prompt(shape, fname, sig, summary)
            if prompt not in seen:
                seen.add(prompt)
                rows.append(
                    {"id": f"code-train/{shape}/{module}.{fname}", "prompt": prompt}
                )
    with gzip.GzipFile(OUT, "wb", mtime=0) as f:
        f.write("".join(json.dumps(r) + "\n" for r in rows).encode())
    print(f"{len(rows)} prompts from {len(found)} stdlib functions -> {OUT}")


if __name__ == "__main__":
    main()
