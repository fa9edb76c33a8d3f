"""`dflash-mlx chat`: a terminal chat with live speculative-decoding statistics."""

import signal

import typer

from . import options

NOT_UTF8 = (
    "That message is not valid UTF-8 and was dropped: set the terminal's encoding to "
    "UTF-8 (e.g. LANG=C.UTF-8)."
)


class SoftInterrupt:
    """First Ctrl-C stops the answer at the next block; a second one interrupts hard."""

    def __init__(self):
        self.requested = False

    def _handler(self, signum, frame):
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True

    def __enter__(self):
        self._previous = signal.signal(signal.SIGINT, self._handler)
        return self

    def __exit__(self, *exc):
        signal.signal(signal.SIGINT, self._previous)
        return False


def answer(session, out, text: str, note: str | None, group=None):
    """Stream one answer; Ctrl-C stops it at the next block (on every rank: rank 0's
    decision is shared once per block when the target is sharded)."""
    from . import ui
    from .answer_ui import AnswerView

    def line(stats, final: bool):
        return (ui.summary_line if final else ui.status_line)(stats, note)

    settings = session.settings
    views: list = []  # the answer's view, once open: it shows the prefill's progress

    def progress(done: int, total: int):
        if views:
            views[0].prefilling(done, total)

    try:
        chunks = session.stream(text, progress)
    except ValueError as e:
        ui.error(out, str(e))
        return
    stopped = False
    with SoftInterrupt() as stop:
        try:
            with AnswerView(
                out,
                line,
                markdown=settings.markdown,
                color=settings.color,
                err=ui.console(stderr=True),
            ) as view:
                views.append(view)
                for chunk in chunks:
                    view.update(chunk)
                    requested = stop.requested
                    if group is not None:
                        requested = bool(group.broadcast([int(requested)])[0])
                    if requested:
                        stop.requested = True
                        break
                chunks.close()  # records the turn before the view prints its summary
                stopped = (
                    stop.requested and session.turns[-1].finish_reason == "interrupted"
                )
        except KeyboardInterrupt:
            stopped = True
        except Exception as e:  # one bad turn must not end the chat
            ui.error(
                out, str(e) if isinstance(e, ValueError) else f"{type(e).__name__}: {e}"
            )
        finally:
            chunks.close()
    if stopped:
        ui.interrupted(out)


def chat(
    model: str | None = options.model(),
    draft: str | None = options.draft(),
    block_size: str | None = options.block_size(
        help="Verify block size, or 'auto' (the default) to pick per block from "
        "measured speed and the drafter's confidence."
    ),
    temp: float = options.temperature(),
    top_p: float = options.top_p(),
    top_k: int = options.top_k(),
    max_tokens: int = options.max_tokens(
        1024, help="Per answer (-1: up to the context)."
    ),
    system: str | None = options.system(),
    thinking: bool | None = options.thinking(),
    no_draft: bool = options.no_draft(),
    color: bool = typer.Option(
        False, "--color", help="Colour tokens: drafted (green) vs target (raw text)."
    ),
    plain: bool = typer.Option(
        False, "--plain", help="Answers as raw text, not rendered Markdown."
    ),
    lookup: bool | None = typer.Option(
        None,
        "--lookup/--no-lookup",
        help="Prompt lookup: copy proposals from the conversation where the text "
        "repeats, chosen per block against the drafter (default: on with "
        "--block-size auto).",
    ),
    history: bool = typer.Option(
        True,
        "--history/--no-history",
        help="Keep what you type (in the user cache) for ↑ and Ctrl-R next time.",
    ),
    pipeline: bool = options.pipeline(),
    kv_bits: str | None = options.kv_bits(),
    kv_group_size: str = options.kv_group_size(),
    json_schema: str | None = options.json_schema(),
    grammar: str | None = options.grammar(),
):
    """Chat in the terminal with live tok/s and acceptance length."""
    from dflash_mlx.chat import Settings

    from . import errors, ui
    from .ranks import join
    from .session import open_session

    out = ui.console()
    with errors.usage(out):
        group = join(pipeline)
        bits, group_size = options.parse_kv(kv_bits, kv_group_size)
        spec = options.parse_grammar(json_schema, grammar)
        settings = Settings(
            kv_bits=bits,
            kv_group_size=group_size,
            grammar=spec,
            temperature=temp,
            top_p=top_p,
            top_k=top_k,
            max_tokens=max_tokens,
            block_size=options.parse_block_size(block_size),
            color=color,
            markdown=not plain,
            lookup=lookup,
        )
    with errors.runtime(out):
        session, note = open_session(
            model,
            draft,
            no_draft,
            system=system,
            thinking=False if spec is not None else thinking,
            settings=settings,
            status=lambda m: ui.loading(out, m),
            distributed=group,
        )
    reader = _reader(out, history, group)
    ui.banner(
        out,
        {
            "model": session.names["model"],
            "draft": session.names["draft"],
            "block_size": session.block_size,
            "note": note,
            "thinking": _thinking_label(session),
            "editing": reader.note if reader else None,
        },
    )
    _loop(session, out, reader, note if session.draft is None else None, group)


def _reader(out, history: bool, group):
    """Rank 0's reader (the others read nothing), with the Markdown renderer warmed
    up before the first answer (its imports and first render take ~0.2 s)."""
    from dflash_mlx.chat.history import history_file

    from . import ui
    from .answer_ui import warm_up
    from .lineedit import open_reader

    if group is not None and not group.is_main:
        return None
    if out.is_terminal:
        warm_up(out)
    path = history_file() if history else None
    return open_reader(out, path, warn=lambda message: ui.warning(out, message))


_LEAVE = "\x04"  # what rank 0 tells the other ranks at Ctrl-D


def _read(out, reader, group) -> str:
    """The next message: typed on rank 0 and shared with every rank. Ctrl-C at the
    prompt cancels the line being typed, as in Python's REPL."""
    from . import ui

    text = None
    while text is None and reader is not None:
        try:
            text = reader.read()
        except EOFError:
            out.print()
            text = _LEAVE
        except KeyboardInterrupt:
            ui.cancelled(out)
        except UnicodeError:  # bytes that are not UTF-8, from input() or the editor
            ui.error(out, NOT_UTF8)
    if group is not None:
        return group.broadcast_text(text)
    assert text is not None  # the loop above ends only with a message
    return text


def _loop(session, out, reader, note: str | None, group=None):
    """Read messages until Ctrl-D or /exit: slash commands, else an answer."""
    while True:
        text = _read(out, reader, group)
        if text == _LEAVE:
            return
        if not text.strip():
            continue
        if not text.lstrip().startswith("/"):
            answer(session, out, text, note, group)
        elif not _command(session, out, text, group):
            return


def _command(session, out, text: str, group=None) -> bool:
    """Run one slash command; False when it asks to leave."""
    from dflash_mlx.chat import COMMANDS

    from . import ui

    if group is not None and not group.is_main and text.lstrip().startswith("/save"):
        return True  # rank 0 alone writes files
    try:
        action, message = session.command(text)
    except ValueError as e:
        ui.error(out, str(e))
        return True
    if action == "exit":
        return False
    if action == "help":
        ui.help_table(out, COMMANDS)
    elif action == "stats":
        ui.stats_table(out, session.stats())
    else:
        ui.info(out, message)
    return True


def _thinking_label(session) -> str | None:
    if not session.thinking_supported:
        return None
    state = {None: "template default", True: "on", False: "off"}[session.thinking]
    return f"thinking: {state} (--thinking/--no-thinking)"
