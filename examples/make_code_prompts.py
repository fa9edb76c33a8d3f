"""Write the bundled `code-train` and `code-train-2` prompt sets from the Python
standard library.

    python examples/make_code_prompts.py [--max 1000]
    python examples/make_code_prompts.py --methods

Every public pure-Python function of the stdlib with a one-line summary in its
docstring becomes two coding prompts, in the two shapes the benchmark's code sets use
(HumanEval's "complete this signature and docstring", MBPP's "Write a python function
to ..."), so a drafter for a small target sees code answers in training without
touching the benchmark's test splits. `--methods` does the same for the public methods
of the stdlib's public classes (the HumanEval shape inside its class), a set of its own
so `code-train` and the splits trained on it stay as they were. Only the prompts come
from here: the target writes the responses. Output: dflash_mlx/data/train_code.jsonl.gz
or train_code_2.jsonl.gz (deterministic).
"""

import argparse
import gzip
import importlib
import inspect
import json
import pkgutil
import random
import sys
import textwrap
import warnings
from pathlib import Path

DATA = Path(__file__).parents[1] / "dflash_mlx" / "data"
OUT, METHODS_OUT = DATA / "train_code.jsonl.gz", DATA / "train_code_2.jsonl.gz"
SKIP = ("test", "idlelib", "tkinter", "turtle", "lib2to3", "ensurepip", "pydoc_data",
        "this", "antigravity", "venv", "__main__")  # fmt: skip


# Method summaries that describe plumbing, not a task anyone asks for.
INTERNAL = ("internal", "private", "helper", "override", "subclasses")


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


def _modules():
    for name in _module_names():
        if any(part in SKIP for part in name.split(".")):
            continue
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                yield name, importlib.import_module(name)
        except Exception:
            continue


def _described(func):
    """(signature, summary) of a function worth a prompt, else None."""
    summary = _summary(func)
    try:
        signature = str(inspect.signature(func))
    except (TypeError, ValueError):
        return None
    if summary and len(signature) < 80 and "<" not in signature:
        return signature, summary
    return None


def _functions():
    seen = set()
    for name, module in _modules():
        for fname, func in sorted(vars(module).items()):
            if fname.startswith("_") or not inspect.isfunction(func):
                continue
            if func.__module__ != name or fname in seen:
                continue
            described = _described(func)
            if described:
                seen.add(fname)
                yield name, fname, *described


def _methods():
    """(module, class, method, signature, summary) of the public methods defined in
    the stdlib's public classes, in the module that defines each."""
    for name, module in _modules():
        for cname, cls in sorted(vars(module).items()):
            if cname.startswith("_") or not inspect.isclass(cls):
                continue
            if cls.__module__ != name:
                continue
            for mname, func in sorted(vars(cls).items()):
                if mname.startswith("_") or not inspect.isfunction(func):
                    continue
                described = _described(func)
                if not described or not described[0].startswith("(self"):
                    continue
                summary = described[1]
                if summary.lower().startswith(INTERNAL) or "(" in summary.split()[0]:
                    continue  # plumbing, or a signature written as prose
                yield name, cname, mname, *described


def _prompt(
    shape: str, fname: str, signature: str, summary: str, cls: str | None = None
) -> str:
    if shape == "humaneval":
        code = f'def {fname}{signature}:\n    """{summary}\n    """'
        if cls is not None:
            code = f"class {cls}:\n" + textwrap.indent(code, "    ")
        return (
            "Write a solution to the following problem and make sure that it passes "
            f"the tests:\n```python\n{code}\n```"
        )
    task = summary[0].lower() + summary[1:].rstrip(".")
    return f"Write a python function to {task}."


def _shapes(summary: str) -> tuple[str, ...]:
    """Both shapes where the summary starts with a verb (it reads as a task)."""
    verb = summary.split()[0].lower() not in ("a", "an", "the", "this", "if")
    return ("humaneval", "mbpp") if verb else ("humaneval",)


def _write(path: Path, rows: list[dict]):
    with gzip.GzipFile(path, "wb", mtime=0) as f:
        f.write("".join(json.dumps(r) + "\n" for r in rows).encode())


def function_rows(limit: int) -> list[dict]:
    """The `code-train` records."""
    found = list(_functions())
    random.Random(0).shuffle(found)
    rows, seen = [], set()
    for module, fname, sig, summary in found[:limit]:
        for shape in _shapes(summary):
            prompt = _prompt(shape, fname, sig, summary)
            if prompt not in seen:
                seen.add(prompt)
                rows.append(
                    {"id": f"code-train/{shape}/{module}.{fname}", "prompt": prompt}
                )
    return rows


def method_rows(taken: set[str]) -> list[dict]:
    """The `code-train-2` records: none of whose prompts is in `taken`."""
    found = list(_methods())
    random.Random(0).shuffle(found)
    rows, seen = [], set(taken)
    for module, cls, mname, sig, summary in found:
        for shape in _shapes(summary):
            prompt = _prompt(shape, mname, sig, summary, cls)
            if prompt not in seen:
                seen.add(prompt)
                key = f"{module}.{cls}.{mname}"
                rows.append({"id": f"code-train-2/{shape}/{key}", "prompt": prompt})
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--max", type=int, default=1000, help="functions to use")
    parser.add_argument(
        "--methods", action="store_true", help="write code-train-2 (class methods)"
    )
    args = parser.parse_args()
    if args.methods:
        with gzip.open(OUT, "rt") as f:
            taken = {json.loads(line)["prompt"] for line in f}
        rows = method_rows(taken)
        _write(METHODS_OUT, rows)
        print(f"{len(rows)} prompts from stdlib methods -> {METHODS_OUT}")
        return
    rows = function_rows(args.max)
    _write(OUT, rows)
    print(f"{len(rows)} prompts from stdlib functions -> {OUT}")


if __name__ == "__main__":
    main()
