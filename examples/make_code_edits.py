"""Write the bundled `code-edits` benchmark set: functions pasted back with a request
that keeps most of them.

    python examples/make_code_edits.py [--per-kind 16]

Agents and coding assistants restate what is in their context: a file rewritten with a
small change. Each prompt here pastes one function of the Python standard library and
asks for a change that keeps most of it, in four kinds:
- `rename`: rename one local variable or parameter everywhere;
- `types`: add type hints and a docstring, keep the body (its docstring removed first);
- `fix`: one operator of one line is flipped (`<` to `<=`, `==` to `!=`, ...); fix it;
- `reformat`: the function is re-indented with 2 spaces; reformat it to 4 (PEP 8).

The functions come from the stdlib packages the training sets never use (idlelib,
lib2to3, turtle, turtledemo: `make_code_prompts.py` skips them), read as source files
with `ast` (nothing is imported), so none is a training or benchmark prompt. Output:
dflash_mlx/data/code_edits.jsonl.gz (`id`, `kind`, `prompt`), deterministic for one
Python version (the set shipped was written by Python 3.11).
"""

import argparse
import ast
import gzip
import json
import random
import re
import sysconfig
import textwrap
from pathlib import Path

OUT = Path(__file__).parents[1] / "dflash_mlx" / "data" / "code_edits.jsonl.gz"
PACKAGES = ("idlelib", "lib2to3", "turtle.py", "turtledemo")
KINDS = ("rename", "types", "fix", "reformat")
LINES = (8, 26)  # a function's length in lines, both ends included
# flipped operators for `fix`: (pattern, replacement), each applied to one line
BUGS = (
    (" == ", " != "), (" != ", " == "), (" < ", " <= "), (" > ", " >= "),
    (" <= ", " < "), (" >= ", " > "), (" is None", " is not None"),
    (" is not None", " is None"), (" + 1", " - 1"), (" - 1", " + 1"),
)  # fmt: skip
CLEARER = {"i": "index", "n": "count", "s": "text", "c": "char", "x": "value",
           "k": "key", "v": "item", "t": "token", "p": "part", "m": "match",
           "w": "widget", "e": "event", "f": "file"}  # fmt: skip
ASK = {
    "rename": "Rename `{old}` to `{new}` everywhere in this function and change "
    "nothing else.",
    "types": "Add type hints to this function's signature and a short docstring that "
    "says what it does. Keep the body exactly as it is.",
    "fix": "One line of this function has a bug (a wrong comparison or off-by-one). "
    "Fix that line and keep everything else as it is.",
    "reformat": "Reformat this function to PEP 8 with four-space indentation, "
    "changing nothing else.",
}


def _files() -> list[Path]:
    root = Path(sysconfig.get_paths()["stdlib"])
    files: list[Path] = []
    for name in PACKAGES:
        path = root / name
        found = [path] if path.is_file() else sorted(path.rglob("*.py"))
        files += [f for f in found if "test" not in f.relative_to(root).as_posix()]
    return files


def _functions():
    """(id, source) of every function of the right length, no nested defs, ASCII and
    lines within 88 characters, dedented; methods too."""
    root = Path(sysconfig.get_paths()["stdlib"])
    for path in _files():
        text = path.read_text(encoding="utf-8")
        try:
            tree = ast.parse(text)
        except SyntaxError:
            continue
        lines = text.splitlines()
        for node in ast.walk(tree):
            if not isinstance(node, ast.FunctionDef) or node.decorator_list:
                continue
            if any(
                isinstance(n, (ast.FunctionDef, ast.ClassDef, ast.Lambda))
                for n in ast.walk(node)
                if n is not node
            ):
                continue
            end = node.end_lineno or node.lineno
            if not LINES[0] <= end - node.lineno + 1 <= LINES[1]:
                continue
            source = textwrap.dedent("\n".join(lines[node.lineno - 1 : end]))
            if not source.isascii() or max(map(len, source.splitlines())) > 88:
                continue
            module = path.relative_to(root).with_suffix("").as_posix()
            yield f"{module.replace('/', '.')}.{node.name}@{node.lineno}", source


def _without_docstring(source: str) -> str | None:
    node = ast.parse(source).body[0]
    assert isinstance(node, ast.FunctionDef)
    first = node.body[0]
    if not (isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)):
        return source
    if len(node.body) == 1:
        return None
    lines = source.splitlines()
    start, end = first.lineno - 1, first.end_lineno or first.lineno
    return "\n".join(lines[:start] + lines[end:])


def _rename(source: str) -> tuple[str, dict] | None:
    """The source with a name worth renaming: a parameter or local used 3+ times."""
    node = ast.parse(source).body[0]
    counts: dict[str, int] = {}
    for n in ast.walk(node):
        if isinstance(n, ast.Name):
            counts[n.id] = counts.get(n.id, 0) + 1
        elif isinstance(n, ast.arg) and n.arg not in ("self", "cls"):
            counts[n.arg] = counts.get(n.arg, 0) + 1
    local = {
        n.id
        for n in ast.walk(node)
        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)
    } | {a.arg for a in ast.walk(node) if isinstance(a, ast.arg)}
    names = sorted(k for k, v in counts.items() if v >= 3 and k in local)
    names = [k for k in names if k not in ("self", "cls")]
    if not names:
        return None
    old = max(names, key=lambda k: (counts[k], k))
    new = CLEARER.get(old, f"current_{old}")
    if re.search(rf"\b{re.escape(new)}\b", source):
        return None
    return source, {"old": old, "new": new}


def _bug(source: str, rng: random.Random) -> str | None:
    """The source with one operator flipped on one line (a line of code, not the
    def line or a string)."""
    lines = source.splitlines()
    spots = [
        (i, old, new)
        for i, line in enumerate(lines)
        if i > 0 and not line.strip().startswith(("#", '"', "'"))
        for old, new in BUGS
        if line.count(old) == 1 and '"' not in line and "'" not in line
    ]
    if not spots:
        return None
    i, old, new = rng.choice(spots)
    lines[i] = lines[i].replace(old, new)
    return "\n".join(lines)


def _two_spaces(source: str) -> str:
    out = []
    for line in source.splitlines():
        stripped = line.lstrip(" ")
        depth = (len(line) - len(stripped)) // 4
        out.append("  " * depth + " " * ((len(line) - len(stripped)) % 4) + stripped)
    return "\n".join(out)


def _case(kind: str, source: str, rng: random.Random) -> tuple[str, dict] | None:
    if kind == "rename":
        return _rename(source)
    if kind == "types":
        bare = _without_docstring(source)
        return (bare, {}) if bare and bare.count("\n") >= LINES[0] - 2 else None
    if kind == "fix":
        buggy = _bug(source, rng)
        return (buggy, {}) if buggy else None
    return (_two_spaces(source), {}) if "\n    " in source else None


def prompt(kind: str, code: str, values: dict) -> str:
    return (
        f"Here is a Python function:\n\n```python\n{code}\n```\n\n"
        f"{ASK[kind].format(**values)} Reply with the whole function in one code block."
    )


def rows(per_kind: int) -> list[dict]:
    found = sorted(_functions())
    rng = random.Random(0)
    rng.shuffle(found)
    out: list[dict] = []
    used: set[str] = set()
    for kind in KINDS:
        made = 0
        for fid, source in found:
            if made == per_kind:
                break
            if fid in used:
                continue
            case = _case(kind, source, rng)
            if case is None:
                continue
            used.add(fid)
            made += 1
            out.append(
                {"id": f"code-edits/{kind}/{fid}", "kind": kind,
                 "prompt": prompt(kind, *case)}
            )  # fmt: skip
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--per-kind", type=int, default=16, help="prompts per kind")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    records = rows(args.per_kind)
    with (
        open(args.out, "wb") as raw,
        gzip.GzipFile("", "wb", fileobj=raw, mtime=0) as f,
    ):
        f.write("".join(json.dumps(r) + "\n" for r in records).encode())
    print(f"{len(records)} code-edit prompts -> {args.out}")


if __name__ == "__main__":
    main()
