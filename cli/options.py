"""Options that several commands declare, made once here (a fresh typer.Option per use).

Each function returns the option for a command's signature; the commands keep their own
defaults and help where those differ (`bench` sweeps block sizes, `chat` answers
longer).
"""

import typer

MODEL_HELP = (
    "Target model: local folder, Hugging Face repo id, .gguf file, or gemma3-270m "
    "(Gemma 3 270M, 32K context, fetched once; Gemma Terms of Use) (default: the "
    "built-in one)."
)
DRAFT_HELP = "DFlash drafter (default: the registry's drafter for the target)."
BLOCK_SIZE_HELP = (
    "Verify block size, or 'auto' (the default: picked per block from measured speed)."
)


def model(help: str = MODEL_HELP):
    return typer.Option(None, "--model", "-m", help=help)


def draft(*flags: str, help: str = DRAFT_HELP):
    """`--draft` (with `-d` unless a command gives its own flags)."""
    return typer.Option(None, *(flags or ("--draft", "-d")), help=help)


def block_size(help: str = BLOCK_SIZE_HELP):
    return typer.Option(None, "--block-size", "-b", help=help)


def temperature(*flags: str, help: str = "Temperature (0 = greedy)."):
    # range-checked by the library, which also refuses NaN and infinities
    return typer.Option(0.0, *(flags or ("--temp", "-t")), help=help)


def top_p():
    return typer.Option(
        1.0, "--top-p", min=0.0, max=1.0, help="Nucleus sampling (0 or 1 disables it)."
    )


def top_k():
    return typer.Option(0, "--top-k", min=0, help="0 disables top-k.")


def max_tokens(default: int, help: str = "-1: up to the context."):
    return typer.Option(default, "--max-tokens", "-n", help=help)


def system():
    return typer.Option(None, "--system", "-s", help="System prompt.")


def thinking():
    return typer.Option(
        None,
        "--thinking/--no-thinking",
        help="enable_thinking for templates that support it.",
    )


def lookup():
    return typer.Option(
        None,
        "--lookup/--no-lookup",
        help="Prompt lookup: copy proposals from the prompt and the answer where the "
        "text repeats, chosen per block against the drafter (default: on with "
        "--block-size auto; with --no-draft, --lookup copies without a drafter).",
    )


def no_draft():
    return typer.Option(False, "--no-draft", help="Plain decoding, no drafter.")


def pipeline():
    return typer.Option(
        False,
        "--pipeline",
        help="Under mlx.launch: split the target's layers over the ranks "
        "(pipeline parallel) instead of its matrices (tensor parallel).",
    )


KV_BITS, KV_GROUP_SIZES = (4, 8), (32, 64, 128)


def kv_bits():
    return typer.Option(
        None,
        "--kv-bits",
        help="Quantize the target's attention KV cache to 4 or 8 bits, from the "
        "first prompt token (less memory in long sessions; greedy output equals "
        "plain decoding with the same cache).",
        metavar="4|8",
        show_default=False,
    )


def json_schema():
    return typer.Option(
        None,
        "--json-schema",
        help="Constrain the answer to this JSON schema (a file), exactly under "
        "speculation (the structured extra: pip install 'mlx-dflash[structured]').",
        metavar="FILE",
        show_default=False,
    )


def grammar():
    return typer.Option(
        None,
        "--grammar",
        help="Constrain the answer to this Lark grammar (a file; llguidance's "
        "dialect): exact under speculation.",
        metavar="FILE",
        show_default=False,
    )


def parse_grammar(json_schema: str | None, grammar: str | None):
    """The GrammarSpec of --json-schema or --grammar (None for neither); a ValueError
    for both, an unreadable file or a schema that is not JSON."""
    from pathlib import Path

    from dflash_mlx.structured import GrammarSpec

    if json_schema is not None and grammar is not None:
        raise ValueError("Pass --json-schema or --grammar, not both.")
    path = json_schema if json_schema is not None else grammar
    if path is None:
        return None
    option = "--json-schema" if json_schema is not None else "--grammar"
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(
            f"{option}: cannot read {path} ({e}): give a UTF-8 file."
        ) from None
    if json_schema is not None:
        return GrammarSpec.json_schema(text, f"JSON schema in {path}")
    return GrammarSpec("lark", text, f"grammar in {path}")


def kv_group_size():
    return typer.Option(
        "64",
        "--kv-group-size",
        metavar="32|64|128",
        help="Group size of --kv-bits: 32, 64 or 128.",
    )


def _choice(text: str, choices: tuple[int, ...], option: str) -> int:
    if text.strip() not in [str(c) for c in choices]:
        names = ", ".join(map(str, choices[:-1])) + f" or {choices[-1]}"
        raise typer.BadParameter(f"expected {names}, got {text!r}.", param_hint=option)
    return int(text)


def parse_kv(bits: str | None, group: str) -> tuple[int | None, int]:
    """`--kv-bits` (None: a float cache) and `--kv-group-size`, as ints."""
    size = _choice(group, KV_GROUP_SIZES, "--kv-group-size")
    return (None if bits is None else _choice(bits, KV_BITS, "--kv-bits")), size


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
