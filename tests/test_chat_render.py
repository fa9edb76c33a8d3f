"""The chat's answer view: Markdown cut into blocks as it streams, rendered once per
block (raw with --plain, --color or /render off), and the engine line."""

import io
import random
import re
from types import SimpleNamespace

import pytest
from rich.console import Console
from rich.segment import Segment
from rich.text import Text

from dflash_mlx.chat import Piece
from dflash_mlx.chat.markdown import Block, MarkdownBlocks
from dflash_mlx.chat.stats import TurnStats, proposer
from dflash_mlx.cli import answer_ui, ui

ANSWER = """## Sorting

Use **sorted** on any iterable:

1. `sorted(xs)` returns a new list
2. `xs.sort()` sorts in place

   and returns None

```python
def top(xs, n):
    return sorted(xs)[-n:]
```
Done.
"""
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def stream(text, sizes, chunk_lines=24):
    """MarkdownBlocks fed `text` in pieces of the given sizes (cycled), then closed."""
    blocks, got, i, k = MarkdownBlocks(chunk_lines), [], 0, 0
    while i < len(text):
        n = sizes[k % len(sizes)]
        got += blocks.feed(text[i : i + n])
        i, k = i + n, k + 1
    return got + blocks.close()


def test_blocks_end_at_blank_lines_headings_and_fences():
    got = stream(ANSWER, [len(ANSWER)])
    assert got == [
        Block("## Sorting"),
        Block("Use **sorted** on any iterable:"),
        # an indented line after a blank one continues the list item
        Block(
            "1. `sorted(xs)` returns a new list\n2. `xs.sort()` sorts in place\n\n"
            "   and returns None"
        ),
        Block("def top(xs, n):\n    return sorted(xs)[-n:]", code=True, lang="python"),
        Block("Done."),
    ]


@pytest.mark.parametrize("seed", range(5))
def test_blocks_do_not_depend_on_how_the_text_streams(seed):
    rnd = random.Random(seed)
    sizes = [rnd.randint(1, 7) for _ in range(50)]
    assert stream(ANSWER, sizes) == stream(ANSWER, [len(ANSWER)])


def test_a_block_is_finished_only_when_what_follows_says_so():
    blocks = MarkdownBlocks()
    assert blocks.feed("- one\n- two\n\n") == []  # the list may go on
    assert blocks.tail() == Block("- one\n- two")
    assert blocks.feed("   more of two\n") == []  # indented: it did
    assert blocks.feed("\nNext") == [Block("- one\n- two\n\n   more of two")]
    assert blocks.tail() == Block("Next")
    assert blocks.feed("\n```sh\nls\n") == [Block("Next")]
    assert blocks.tail() == Block("ls", code=True, lang="sh")
    assert blocks.close() == [Block("ls", code=True, lang="sh")]  # an unclosed fence
    assert blocks.tail() is None


def test_long_code_and_long_runs_come_in_chunks():
    code = "".join(f"x{i} = {i}\n" for i in range(7))
    got = stream(f"```py\n{code}```\n", [3], chunk_lines=3)
    assert [b.text.count("\n") + 1 for b in got] == [3, 3, 1]
    assert all(b.code and b.lang == "py" for b in got)
    assert [b.opens for b in got] == [True, False, False]
    assert "\n".join(b.text for b in got) + "\n" == code
    items = "".join(f"- item {i}\n" for i in range(5))
    got = stream(items + "\nafter\n", [4], chunk_lines=2)
    assert [b.opens for b in got] == [True, False, False, True]
    assert got[-1] == Block("after")


def terminal(width=80):
    buffer = io.StringIO()
    console = Console(
        file=buffer, force_terminal=True, width=width, height=30, highlight=False
    )
    return console, buffer


def stats(**kw):
    return TurnStats("dflash", "auto", **kw)


def chunk(pieces):
    return SimpleNamespace(
        pieces=pieces, stats=stats(), text="".join(p[0] for p in pieces)
    )


def show(text, step=5, thinking="", **view):
    """Everything the view writes for an answer streamed `step` characters a block,
    escape codes removed."""
    console, buffer = terminal()
    pieces = [Piece(thinking, False, True)] if thinking else []
    pieces += [
        Piece(text[i : i + step], i % 2 == 0, False) for i in range(0, len(text), step)
    ]
    with answer_ui.AnswerView(
        console, lambda s, final: Text("END" if final else "live"), **view
    ) as v:
        for p in pieces:
            v.update(chunk([p]))
    return ANSI.sub("", buffer.getvalue()), v


def test_markdown_is_rendered_and_raw_text_stays_raw():
    shown, view = show(ANSWER)
    assert "Sorting" in shown and "## Sorting" not in shown
    assert "**" not in shown and "```" not in shown
    assert "def top(xs, n):" in shown and "1 sorted(xs) returns a new list" in shown
    assert shown.rstrip().endswith("END") and view.render_seconds > 0
    for raw in ({"markdown": False}, {"color": True}):  # --plain, /render off; --color
        shown, _ = show(ANSWER, **raw)
        assert "## Sorting" in shown and "```python" in shown and "**sorted**" in shown


class Recording(answer_ui.AnswerView):
    """The view, keeping what it printed for good (above the live tail)."""

    printed_text = ""

    def _print(self, lines):
        self.printed_text += "".join(
            s.text for line in lines for s in line + [Segment("\n")]
        )
        super()._print(lines)


def printed(step, **view):
    """What the view printed for good streaming ANSWER `step` characters a block, and
    how many times it redrew the tail."""
    console, _ = terminal()
    redraws = 0

    def line(stats, final):
        nonlocal redraws
        redraws += not final
        return Text("")

    with Recording(console, line, **view) as v:
        for i in range(0, len(ANSWER), step):
            v.update(chunk([Piece(ANSWER[i : i + step], False, False)]))
    return [text.rstrip() for text in v.printed_text.splitlines()], redraws


def test_each_finished_block_is_printed_once_and_only_the_tail_redrawn():
    # a redraw after every block of 3 characters: what is finished is still printed
    # once, the same as when the whole answer comes in one block
    streamed, redraws = printed(3, refresh_seconds=0, cost_ratio=0)
    assert redraws >= len(ANSWER) // 3
    at_once, _ = printed(len(ANSWER))
    assert streamed == at_once
    for text in ("Sorting", "Use sorted on any iterable:", "def top(xs, n):", "Done."):
        assert sum(text in line for line in streamed) == 1, text


def test_thinking_stays_raw_and_dimmed():
    console, buffer = terminal()
    thought = "<think>\nI should use **sorted**.\n</think>\n\n"
    with answer_ui.AnswerView(console, lambda s, final: Text("END")) as v:
        v.update(chunk([Piece(thought, False, True), Piece("**Yes**.", False, False)]))
    out = buffer.getvalue()
    assert "\x1b[2;3m" in out  # dim italic
    plain = ANSI.sub("", out)
    assert (
        "I should use **sorted**." in plain
        and "**Yes**" not in plain
        and "Yes." in plain
    )


def test_control_characters_never_reach_the_terminal():
    for view in ({}, {"markdown": False}):
        console, buffer = terminal()
        with answer_ui.AnswerView(console, lambda s, f: Text(""), **view) as v:
            v.update(chunk([Piece("a\x1b[2Jb\rc\x07d\x08\te\n", False, False)]))
        out = buffer.getvalue()
        assert "a␛[2Jb␍c␇d␈" in ANSI.sub("", out)
        assert "\x1b[2J" not in out and "\x07" not in out and "\x08" not in out


def test_without_a_terminal_the_answer_is_raw_text(capsys):
    console = Console(file=io.StringIO(), force_terminal=False)
    err = Console(file=io.StringIO(), force_terminal=False)
    line = lambda s, final: Text("summary")  # noqa: E731
    with answer_ui.AnswerView(console, line, err=err) as v:
        v.update(chunk([Piece("## Title\n", True, False)]))
    assert capsys.readouterr().out == "## Title\n\n"
    assert err.file.getvalue() == "summary\n"


def response(block_size, **fields):
    r = SimpleNamespace(
        accepted=block_size,
        block_size=block_size,
        from_draft=block_size - 1,
        generation_tokens=10,
        generation_tps=5.0,
        peak_memory=0.1,
        prompt_tokens=3,
        prompt_tps=1.0,
        reused_tokens=0,
    )
    r.__dict__.update(fields)
    return r


def engine(responses, mode="dflash", block_size="auto"):
    st = TurnStats(mode, block_size)
    st.add(response(1, accepted=None), 0.1)  # the first token
    for r in responses:
        st.add(r, 0.2)
    return st


def test_engine_line_says_when_auto_decodes_plainly():
    st = engine([response(4), response(1), response(1)])
    assert (st.blocks, st.drafted_blocks, st.plain_blocks) == (3, 1, 2)
    live = ui.status_line(st).plain
    assert "DFlash auto · now plain · 1/3 blocks drafted" in live
    assert "DFlash auto: 1/3 blocks drafted (b4), 2 plain" in ui.summary_line(st).plain
    st = engine([response(1)] * 3)
    assert "DFlash auto: 0/3 blocks drafted, all plain" in ui.summary_line(st).plain
    st = engine([response(2), response(8)])
    assert "now b8 draft · 2/2 blocks drafted" in ui.status_line(st).plain
    assert "2/2 blocks drafted (b2–b8) ·" in ui.summary_line(st).plain
    st = engine([response(1)] * 2, mode="plain", block_size=1)
    assert " · plain · " in ui.summary_line(st).plain
    assert "blocks" not in ui.status_line(st).plain


def test_engine_line_names_the_proposer_once_the_engine_reports_it():
    # prompt lookup's `source` field: "draft", "lookup", "splice" or None (plain)
    assert proposer(response(4)) == "draft" and proposer(response(1)) is None
    assert proposer(response(4, source="lookup")) == "lookup"
    assert proposer(response(4, source=None)) is None
    st = engine(
        [
            response(4, source="lookup"),
            response(3, source="draft"),
            response(5, source="splice"),
            response(1, source=None),
        ]
    )
    assert "now plain · 3/4 blocks drafted" in ui.status_line(st).plain
    summary = ui.summary_line(st).plain
    assert "3/4 blocks drafted (b3–b5; draft 1, lookup 1, splice 1), 1 plain" in summary
    st = engine([response(4, source="lookup")])
    assert "now b4 lookup" in ui.status_line(st).plain
    # no drafter, lookup on: plain steps and copies
    st = engine([response(3, source="lookup"), response(1, source=None)], "lookup", 1)
    assert "plain + lookup · now plain · 1/2 blocks copied" in ui.status_line(st).plain
    summary = ui.summary_line(st).plain
    assert "plain + lookup: 1/2 blocks copied (b3; lookup 1), 1 plain · τ" in summary


def test_a_long_prompt_shows_its_prefill_progress_and_a_short_one_does_not():
    for total, shown in ((4096, True), (300, False)):
        console, buffer = terminal()
        with answer_ui.AnswerView(console, lambda s, final: Text("END")) as v:
            for done in range(0, total, 1024):
                v.prefilling(done, total)
            v.prefilling(total, total)
            v.update(chunk([Piece("hi", True, False)]))
            v.prefilling(total, total)  # too late: the answer is running
        out = ANSI.sub("", buffer.getvalue())
        assert ("reading the prompt: 3,072 / 4,096 tokens" in out) is shown
        assert out.count("reading the prompt") == (5 if shown else 0)
