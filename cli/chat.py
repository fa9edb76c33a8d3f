"""`dflash-mlx chat`: a terminal chat with live speculative-decoding statistics."""

import signal

import typer

MODEL_HELP = (
    "Target model: local folder or Hugging Face repo id (default: the built-in one)."
)
DRAFT_HELP = "DFlash drafter (default: the registry's drafter for the target)."


def open_session(
    model,
    draft,
    no_draft,
    *,
    system=None,
    thinking=None,
    settings=None,
    raw=False,
    status=None,
):
    """Resolve and load target + drafter; (ChatSession, note). Raises ValueError to fix."""
    from contextlib import nullcontext

    from dflash_mlx import load, load_draft
    from dflash_mlx.chat import ChatSession, resolve_models

    model, draft, note = resolve_models(model, draft, no_draft)
    with status(model) if status else nullcontext():
        target, tokenizer = load(model)
        drafter = load_draft(draft, target=target) if draft else None
        _warm_up(target, tokenizer, drafter)
    session = ChatSession(
        target,
        tokenizer,
        drafter,
        system=system,
        thinking=thinking,
        settings=settings,
        raw=raw,
        names={"model": model, "draft": draft},
    )
    if thinking is not None and not raw and not session.thinking_supported:
        note = "; ".join(
            filter(None, [note, "this chat template has no thinking switch"])
        )
    return session, note


def _warm_up(target, tokenizer, drafter):
    """A short throwaway generation, so MLX compiles its kernels (on a CPU once per machine,
    ~6 s for the demo pair) behind the loading spinner instead of in the first answer."""
    from dflash_mlx import stream_generate

    block = drafter.args.block_size if drafter is not None else 1
    # the prefill, then one full block: every kernel shape of a verify
    for _ in stream_generate(
        target, drafter, tokenizer, "Hello", max_tokens=1 + block, block_size=block
    ):
        pass


class SoftInterrupt:
    """First Ctrl-C asks the answer to stop at the next block; a second one interrupts hard."""

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


def answer(session, out, text: str, note: str | None):
    from . import ui

    try:
        chunks = session.stream(text)
    except ValueError as e:
        ui.error(out, str(e))
        return
    stopped = False
    with SoftInterrupt() as stop:
        try:
            with ui.AnswerView(out, session.settings.color, note) as view:
                for chunk in chunks:
                    view.update(chunk)
                    if stop.requested:
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


def parse_block_size(text: str | None):
    """`--block-size` value: None, "auto", or an integer >= 1."""
    if text is None or text == "auto":
        return text
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise typer.BadParameter(
            f"expected an integer >= 1 or 'auto', got {text!r}.",
            param_hint="--block-size",
        )
    return value


def chat(
    model: str | None = typer.Option(None, "--model", "-m", help=MODEL_HELP),
    draft: str | None = typer.Option(None, "--draft", "-d", help=DRAFT_HELP),
    block_size: str | None = typer.Option(
        None,
        "--block-size",
        "-b",
        help="Verify block size, or 'auto' (the default) to pick per block from measured "
        "speed and the drafter's confidence.",
    ),
    temp: float = typer.Option(
        0.0, "--temp", "-t", min=0.0, help="Temperature (0 = greedy)."
    ),
    top_p: float = typer.Option(1.0, "--top-p", min=0.0, max=1.0),
    top_k: int = typer.Option(0, "--top-k", min=0, help="0 disables top-k."),
    max_tokens: int = typer.Option(
        1024, "--max-tokens", "-n", help="Per answer (-1: up to the context)."
    ),
    system: str | None = typer.Option(None, "--system", "-s", help="System prompt."),
    thinking: bool | None = typer.Option(
        None,
        "--thinking/--no-thinking",
        help="enable_thinking for templates that support it.",
    ),
    no_draft: bool = typer.Option(
        False, "--no-draft", help="Plain decoding, no drafter."
    ),
    color: bool = typer.Option(
        False, "--color", help="Colour tokens: drafted (green) vs target."
    ),
):
    """Chat in the terminal with live tok/s and acceptance length."""
    from dflash_mlx.chat import COMMANDS, Settings

    from . import ui

    out = ui.console()
    settings = Settings(
        temperature=temp,
        top_p=top_p,
        top_k=top_k,
        max_tokens=max_tokens,
        block_size=parse_block_size(block_size),
        color=color,
    )
    try:
        session, note = open_session(
            model,
            draft,
            no_draft,
            system=system,
            thinking=thinking,
            settings=settings,
            status=lambda m: ui.loading(out, m),
        )
    except ValueError as e:
        ui.error(out, str(e))
        raise typer.Exit(1)
    ui.banner(
        out,
        {
            "model": session.names["model"],
            "draft": session.names["draft"],
            "block_size": session.block_size,
            "note": note,
            "thinking": _thinking_label(session),
        },
    )
    while True:
        try:
            text = ui.read_message(out)
        except (EOFError, KeyboardInterrupt):
            out.print()
            return
        if not text.strip():
            continue
        if text.lstrip().startswith("/"):
            try:
                action, message = session.command(text)
            except ValueError as e:
                ui.error(out, str(e))
                continue
            if action == "exit":
                return
            if action == "help":
                ui.help_table(out, COMMANDS)
            elif action == "stats":
                ui.stats_table(out, session.stats())
            else:
                ui.info(out, message)
            continue
        answer(session, out, text, note if session.draft is None else None)


def _thinking_label(session) -> str | None:
    if not session.thinking_supported:
        return None
    state = {None: "template default", True: "on", False: "off"}[session.thinking]
    return f"thinking: {state} (--thinking/--no-thinking)"
