"""Loading a chat session for `chat` and `generate`: names → models → a warm session;
the warm-up `serve` shares, and the one warning about slow CPU kernels."""

from functools import cache


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
    distributed=None,
):
    """Resolve and load target + drafter; (ChatSession, note). Raises ValueError to fix.

    `status(name)`, when given, is a context manager shown while the models load;
    `distributed` (a Group) loads this rank's shard of the target."""
    from contextlib import nullcontext

    from dflash_mlx import load, load_draft
    from dflash_mlx.chat import ChatSession
    from dflash_mlx.loading.resolve import resolve_models

    warn_without_compiler()
    model, draft, note = resolve_models(model, draft, no_draft)
    with status(model) if status else nullcontext():
        target, tokenizer = load(model, distributed=distributed)
        drafter = None
        if draft:
            drafter = load_draft(draft, target=target, distributed=distributed)
        # one process: the timings file under the user cache (ranks must all run the
        # same warm-up, which files that differ per machine would break)
        timings = _timings(model, draft) if distributed is None else None
        policy = _warm_up(target, tokenizer, drafter, timings)
    session = ChatSession(
        target,
        tokenizer,
        drafter,
        system=system,
        thinking=thinking,
        settings=settings,
        raw=raw,
        names={"model": model, "draft": draft},
        policy=policy,
    )
    note = _join(note, _cap_block_size(settings, drafter))
    if thinking is not None and not raw and not session.thinking_supported:
        note = _join(note, "this chat template has no thinking switch")
    return session, note


def _cap_block_size(settings, drafter) -> str | None:
    """Cap a fixed block size at the drafter's; the note saying so, or None."""
    from dflash_mlx import validate

    if drafter is None or settings is None or not isinstance(settings.block_size, int):
        return None
    settings.block_size, note = validate.block_size(
        settings.block_size, drafter.args.block_size
    )
    return note


def _join(*notes) -> str | None:
    return "; ".join(n for n in notes if n) or None


def _timings(model, draft):
    """The file keeping this machine's block timings for the pair, or None."""
    from dflash_mlx.engine.calibrate import timings_file
    from dflash_mlx.files import user_cache

    return timings_file(user_cache() / "timings", model, draft) if draft else None


def _warm_up(target, tokenizer, drafter, timings=None):
    """A short throwaway generation, so MLX compiles its kernels (on a CPU once per
    machine, ~6 s for the demo pair) behind the loading spinner, not in the first
    answer. With a drafter it times every block size too: the session's adaptive
    policy, which then starts calibrated (see dflash_mlx/engine/calibrate.py), from the
    `timings` file when an earlier process wrote it."""
    from dflash_mlx import stream_generate
    from dflash_mlx.engine.calibrate import calibrate

    warn_without_compiler()
    if drafter is not None:
        return calibrate(target, drafter, tokenizer, timings=timings)
    for _ in stream_generate(target, None, tokenizer, "Hello", max_tokens=2):
        pass
    return None


@cache
def warn_without_compiler():
    """Once per process, on a Linux CPU with no C++ compiler: the native kernels
    (dflash_mlx/cpu/native) cannot be built, so the CPU keeps MLX's matmuls; say what
    to install (`doctor` says it too)."""
    import sys

    import mlx.core as mx

    if not sys.platform.startswith("linux") or mx.default_device() != mx.cpu:
        return
    from dflash_mlx.cpu import native

    if native.compiler() is None:
        from . import ui

        ui.warning(
            ui.console(stderr=True),
            "no C++ compiler found, so the native CPU kernels cannot be built and "
            "decoding is up to 1.5x slower. Install one (Debian/Ubuntu: `sudo "
            "apt-get install g++`, or build-essential); they build on first use.",
        )
