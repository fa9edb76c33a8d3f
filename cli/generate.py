"""`dflash-mlx generate`: one prompt, the answer on stdout, statistics on stderr."""

import json
import sys

import typer

from . import options


def generate(
    prompt: str = typer.Option(
        ..., "--prompt", "-p", help="The prompt; '-' reads it from stdin."
    ),
    model: str | None = options.model(),
    draft: str | None = options.draft(),
    block_size: str | None = options.block_size(),
    temp: float = options.temperature(),
    top_p: float = options.top_p(),
    top_k: int = options.top_k(),
    max_tokens: int = options.max_tokens(256),
    system: str | None = options.system(),
    thinking: bool | None = options.thinking(),
    no_draft: bool = options.no_draft(),
    lookup: bool | None = options.lookup(),
    raw: bool = typer.Option(
        False, "--raw", help="Send the prompt as-is, without the chat template."
    ),
    as_json: bool = typer.Option(
        False, "--json", help="Print one JSON record instead of the text."
    ),
    seed: int | None = typer.Option(None, "--seed", help="Random seed for sampling."),
    pipeline: bool = options.pipeline(),
    kv_bits: str | None = options.kv_bits(),
    kv_group_size: str = options.kv_group_size(),
    json_schema: str | None = options.json_schema(),
    grammar: str | None = options.grammar(),
    check: bool = typer.Option(
        False,
        "--check",
        help="Also decode plainly and compare: identical, near-ties (named, with the "
        "logit gap) or a mismatch (exit 1). Greedy only.",
    ),
):
    """Generate one answer: text to stdout, statistics to stderr (or --json)."""
    from dflash_mlx import validate
    from dflash_mlx.chat import Settings

    from . import errors, ui
    from .ranks import describe, join
    from .session import open_session

    err = ui.console(stderr=True)
    with errors.usage(err):
        group = join(pipeline)
        if group is None or group.is_main:  # rank 0 reads it (stdin too) for all
            prompt = _read_prompt(prompt)
        validate.seed(seed)
        _check_options(check, temp, group)
        bits, group_size = options.parse_kv(kv_bits, kv_group_size)
        spec = options.parse_grammar(json_schema, grammar)
        settings = Settings(
            kv_bits=bits,
            kv_group_size=group_size,
            grammar=spec,
            seed=seed,
            temperature=temp,
            top_p=top_p,
            top_k=top_k,
            max_tokens=max_tokens,
            block_size=options.parse_block_size(block_size),
            lookup=lookup,
        )
    if group is not None:
        prompt = group.broadcast_text(prompt)
    with errors.runtime(err):
        session, note = open_session(
            model,
            draft,
            no_draft,
            system=system,
            thinking=False if spec is not None else thinking,
            settings=settings,
            raw=raw,
            distributed=group,
        )
        user = [{"role": "user", "content": prompt}]  # as `stream` encodes it:
        prompt_ids = session.render(user) if check else []  # for plain decoding
        text, stats, tokens = _stream(session, prompt, not as_json)
        exact = _check(session, prompt_ids, tokens, spec) if check else None
    if as_json:
        sampling = {"temperature": temp, "top_p": top_p, "top_k": top_k, "seed": seed}
        record = _record(session, note, text, stats, sampling)
        _print_json(record, tokens, describe(group), exact)
    else:
        sys.stdout.write("\n")
        ui.generate_stats(err, stats, note)
    if exact is not None:
        _report(err, exact)


def _stream(session, prompt: str, echo: bool) -> tuple[str, object, list[int]]:
    """Decode the answer (written to stdout as it comes with `echo`): its text, the
    last statistics and the tokens."""
    text, stats, tokens = "", None, []
    for chunk in session.stream(prompt):
        text += chunk.text
        stats = chunk.stats
        tokens += chunk.response.tokens
        if echo:
            sys.stdout.write(chunk.text)
            sys.stdout.flush()
    return text, stats, tokens


def _print_json(record: dict, tokens: list[int], distributed, exact):
    """The --json record on stdout, with the tokens and what ran them."""
    record.update(tokens=tokens, distributed=distributed)
    if exact is not None:
        record["exactness"] = exact.to_dict()
    sys.stdout.write(json.dumps(record, ensure_ascii=False) + "\n")


def _check_options(check: bool, temp: float, group):
    if check and (temp != 0 or group is not None):
        raise ValueError(
            "--check compares greedy output with plain decoding in one process: "
            "drop --temp (or set it to 0) and --pipeline."
        )


def _check(session, prompt_ids: list[int], tokens: list[int], spec=None):
    """The answer against plain mlx-lm decoding of the same prompt, on the same KV
    cache quantization (exactness.py), under the same grammar when there is one."""
    from dflash_mlx.engine.exactness import check

    s = session.settings
    if spec is None:
        return check(
            session.model,
            session.tokenizer,
            prompt_ids,
            tokens,
            s.kv_bits,
            s.kv_group_size,
        )
    import mlx_lm

    from dflash_mlx.engine.exactness import IDENTICAL, MISMATCH, Difference, Exactness

    steps = mlx_lm.stream_generate(
        session.model,
        session.tokenizer,
        prompt_ids,
        max_tokens=len(tokens),
        logits_processors=[session.grammar_processor()],
    )
    reference = [r.token for r in steps]
    if reference == tokens:
        return Exactness(IDENTICAL, (), len(tokens))
    i = next(
        (i for i, (a, b) in enumerate(zip(reference, tokens, strict=False)) if a != b),
        min(len(reference), len(tokens)),
    )
    at = lambda seq: seq[i] if i < len(seq) else None  # noqa: E731
    return Exactness(MISMATCH, (Difference(i, at(reference), at(tokens)),), i)


def _report(err, exact):
    """The verdict on stderr; a mismatch exits 1."""
    from . import ui

    if exact.verdict == "identical":
        ui.info(err, f"check: {exact.describe()}")
    elif exact.ok:
        ui.warning(err, f"check: {exact.describe()}")
    else:
        ui.error(err, f"check: {exact.describe()}")
        raise typer.Exit(1)


def _record(session, note, text: str, stats, sampling: dict) -> dict:
    """The --json record of one answer."""
    from dflash_mlx.conversation import split_thinking

    thought, answer = split_thinking(text)
    return {
        "model": session.names["model"],
        "draft": session.names["draft"],
        "note": note,
        "text": text,
        "thinking": thought,
        "answer": answer,
        "finish_reason": stats.finish_reason,
        "mode": stats.mode,
        "block_size": stats.block_size,
        "sources": dict(stats.sources),
        "prompt_tokens": stats.prompt_tokens,
        "generation_tokens": stats.generation_tokens,
        "prompt_tps": stats.prompt_tps,
        "generation_tps": stats.generation_tps,
        "ttft_s": stats.ttft,
        "elapsed_s": stats.elapsed,
        "mean_acceptance": stats.mean_accepted,
        "drafted_tokens": stats.drafted,
        "peak_memory_gb": stats.peak_memory,
        **sampling,
    }


def _read_prompt(prompt: str) -> str:
    """The prompt (stdin for '-'), checked: a ValueError if empty or not UTF-8."""
    from dflash_mlx import validate

    if prompt == "-":
        try:
            prompt = sys.stdin.read()
        except UnicodeDecodeError as e:
            raise ValueError(
                f"The prompt on stdin is not valid UTF-8 (byte {e.object[e.start]:#x} "
                f"at offset {e.start}): convert it, e.g. `iconv -f latin1 -t utf-8`."
            ) from None
    if not prompt.strip():
        raise ValueError(
            "The prompt is empty: pass --prompt TEXT, or --prompt - with text on stdin."
        )
    return validate.text(prompt)
