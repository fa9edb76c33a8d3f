"""`dflash-mlx generate`: one prompt, the answer on stdout, statistics on stderr."""

import json
import sys

import typer

from .chat import DRAFT_HELP, MODEL_HELP, parse_block_size


def generate(
    prompt: str = typer.Option(
        ..., "--prompt", "-p", help="The prompt; '-' reads it from stdin."
    ),
    model: str | None = typer.Option(None, "--model", "-m", help=MODEL_HELP),
    draft: str | None = typer.Option(None, "--draft", "-d", help=DRAFT_HELP),
    block_size: str | None = typer.Option(
        None,
        "--block-size",
        "-b",
        help="Verify block size, or 'auto' (the default: picked per block from measured speed).",
    ),
    temp: float = typer.Option(
        0.0, "--temp", "-t", min=0.0, help="Temperature (0 = greedy)."
    ),
    top_p: float = typer.Option(1.0, "--top-p", min=0.0, max=1.0),
    top_k: int = typer.Option(0, "--top-k", min=0, help="0 disables top-k."),
    max_tokens: int = typer.Option(
        256, "--max-tokens", "-n", help="-1: up to the context."
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
    raw: bool = typer.Option(
        False, "--raw", help="Send the prompt as-is, without the chat template."
    ),
    as_json: bool = typer.Option(
        False, "--json", help="Print one JSON record instead of the text."
    ),
    seed: int | None = typer.Option(
        None, "--seed", help="Random seed for sampling."
    ),
):
    """Generate one answer: text to stdout, statistics to stderr (or --json)."""
    from dflash_mlx.chat import Settings, split_thinking

    from . import ui
    from .chat import open_session

    err = ui.console(stderr=True)
    if prompt == "-":
        prompt = sys.stdin.read()
    if not prompt.strip():
        ui.error(
            err,
            "The prompt is empty: pass --prompt TEXT, or --prompt - with text on stdin.",
        )
        raise typer.Exit(2)
    if max_tokens == 0:
        ui.error(err, "--max-tokens must be positive (or -1 for up to the context).")
        raise typer.Exit(2)
    if seed is not None:
        import mlx.core as mx

        mx.random.seed(seed)
    settings = Settings(
        temperature=temp,
        top_p=top_p,
        top_k=top_k,
        max_tokens=max_tokens,
        block_size=parse_block_size(block_size),
    )
    try:
        session, note = open_session(
            model,
            draft,
            no_draft,
            system=system,
            thinking=thinking,
            settings=settings,
            raw=raw,
        )
        text, stats = "", None
        for chunk in session.stream(prompt):
            text += chunk.text
            stats = chunk.stats
            if not as_json:
                sys.stdout.write(chunk.text)
                sys.stdout.flush()
    except ValueError as e:
        ui.error(err, str(e))
        raise typer.Exit(1)
    if as_json:
        thought, answer = split_thinking(text)
        record = {
            "model": session.names["model"],
            "draft": session.names["draft"],
            "note": note,
            "text": text,
            "thinking": thought,
            "answer": answer,
            "finish_reason": stats.finish_reason,
            "mode": stats.mode,
            "block_size": stats.block_size,
            "prompt_tokens": stats.prompt_tokens,
            "generation_tokens": stats.generation_tokens,
            "prompt_tps": stats.prompt_tps,
            "generation_tps": stats.generation_tps,
            "ttft_s": stats.ttft,
            "elapsed_s": stats.elapsed,
            "mean_acceptance": stats.mean_accepted,
            "drafted_tokens": stats.drafted,
            "peak_memory_gb": stats.peak_memory,
            "temperature": temp,
            "top_p": top_p,
            "top_k": top_k,
            "seed": seed,
        }
        sys.stdout.write(json.dumps(record, ensure_ascii=False) + "\n")
    else:
        sys.stdout.write("\n")
        ui.generate_stats(err, stats, note)
