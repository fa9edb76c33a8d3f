"""Agent-shaped long prompts, built reproducibly from the licensed text bundled with the
package (data/SOURCES.md): a coding agent's tool documentation, then files it read and
tool results it got (HumanEval and MBPP solutions, standard-library functions from
`code-edits`, worked gsm8k-train problems as notes), then one request. Two kinds of
request, as agents send them:

- "edit": restate one of the files read, with a small change (the answer copies the
  context: where prompt lookup pays);
- "prose": a fresh answer in prose about the project (nothing to copy).

`agent_prompt(count, tokens, kind)` fills the context up to `tokens` tokens of the
caller's tokenizer (`count(text) -> int`), so every model gets the length asked for.
"""

import random
import re
from dataclasses import dataclass

from ..datasets import DATA_DIR, read_jsonl_gz

KINDS = ("edit", "prose")
TOOLS = """You are a coding agent working in a Python repository. You act through tools;
each call's result is shown to you as <tool_result>.

Tools:
- read_file(path): the file's full text.
- list_dir(path): the names in a folder, one per line.
- grep(pattern, path): matching lines as path:line:text.
- edit_file(path, old, new): replace the exact text `old` with `new` in the file;
  fails when `old` does not occur exactly once.
- run_tests(path): run pytest on a file or folder and show its report.
- notes(): the notes the team keeps for the project, in Markdown.

Rules: read before you edit; keep edits minimal; never invent file contents; when asked
for a file or function, reply with all of it in one ```python block and nothing else.
"""
PROSE_REQUEST = (
    "Without writing code, explain in a few paragraphs of plain prose what the files "
    "you read above do, which of their functions you would test first and why, and "
    "what risks you see in changing them."
)


@dataclass(frozen=True)
class _File:
    path: str
    text: str
    name: str  # the first function it defines (the edit request's subject)


def _functions() -> list[_File]:
    """Every bundled piece of code as a file: HumanEval and MBPP solutions, and the
    standard-library functions of code-edits."""
    files = []
    for row in read_jsonl_gz(DATA_DIR / "humaneval.jsonl.gz"):
        text = row["prompt"] + row["canonical_solution"]
        files.append(_file(f"solutions/he_{row['task_id'].split('/')[1]}.py", text))
    for row in read_jsonl_gz(DATA_DIR / "mbpp_sanitized.jsonl.gz"):
        files.append(_file(f"solutions/mbpp_{row['task_id']}.py", row["code"]))
    for row in read_jsonl_gz(DATA_DIR / "code_edits.jsonl.gz"):
        code = re.search(r"```python\n(.*?)```", row["prompt"], re.S)
        if code:
            files.append(_file(f"lib/{row['id']}.py", code.group(1)))
    return [f for f in files if f.name]


def _file(path: str, text: str) -> _File:
    name = re.search(r"^def (\w+)", text, re.M)
    return _File(path, text.strip() + "\n", name.group(1) if name else "")


def _notes(rng: random.Random, n: int) -> str:
    rows = read_jsonl_gz(DATA_DIR / "train_gsm8k.jsonl.gz")
    picked = rng.sample(rows, n)
    return "\n\n".join(
        f"## {r['question']}\n{re.sub(r'<<[^>]*>>', '', r['answer'])}" for r in picked
    )


def _result(tool: str, arg: str, text: str) -> str:
    return f'<tool_result tool="{tool}" arg="{arg}">\n{text}</tool_result>\n'


def _edit_request(f: _File) -> str:
    return (
        f"In {f.path}, rename the function `{f.name}` to `{f.name}_checked` and change "
        "nothing else. Reply with the whole updated file in one ```python block."
    )


def agent_prompt(count, tokens: int, kind: str, seed: int = 0) -> str:
    """One prompt of about `tokens` tokens (by `count`) ending in a `kind` request."""
    if kind not in KINDS:
        raise ValueError(f"Unknown prompt kind '{kind}': choose from {KINDS}.")
    rng = random.Random(seed)
    files = _functions()
    rng.shuffle(files)
    # the edited file is one of average size, read early: the answer restates it
    subject = min(files[:40], key=lambda f: abs(len(f.text) - 700))
    request = "\n" + (_edit_request(subject) if kind == "edit" else PROSE_REQUEST)
    listing = "\n".join(f.path for f in files[:40])
    parts = [TOOLS, _result("list_dir", "solutions", listing)]
    parts.append(_result("read_file", subject.path, subject.text))
    limit = tokens - 16  # the chat template's own tokens
    _add_files(parts, [f for f in files if f is not subject], count, request, limit)
    return _add_notes("".join(parts), rng, count, request, limit)


def _add_files(parts: list[str], files: list[_File], count, request: str, limit: int):
    """Files read, while they fit."""
    budget = limit - count("".join(parts)) - count(request)
    for f in files:
        piece = _result("read_file", f.path, f.text)
        cost = count(piece)
        if cost > budget:
            break
        parts.append(piece)
        budget -= cost
    while len(parts) > 3 and count("".join(parts) + request) > limit:
        parts.pop()  # the pieces' counts fell short of the whole's (merged joins)


def _add_notes(prompt: str, rng: random.Random, count, request: str, limit: int):
    """The team's notes after the files, cut to fill the prompt to `limit` tokens."""
    budget = limit - count(prompt + request)
    if budget <= 64:
        return prompt + request
    notes = ""
    while count(notes) < budget:
        notes += _notes(rng, 8) + "\n\n"
    words = notes.split(" ")
    keep = len(words)
    while keep > 0:
        text = prompt + _result("notes", "", " ".join(words[:keep])) + request
        over = count(text) - limit
        if over <= 0:
            return text
        keep -= max(1, over * keep // max(1, count(" ".join(words[:keep]))) + 8)
    return prompt + request
