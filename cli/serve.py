"""`dflash-mlx serve`: an OpenAI-, Anthropic- and Responses-compatible HTTP server."""

import re

import typer

from . import options
from .options import DRAFT_HELP, MODEL_HELP, parse_block_size

LOOPBACK = ("127.0.0.1", "localhost", "::1")
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def parse_bytes(text: str, option: str) -> int:
    """'2G', '512MiB', '1000000' -> bytes."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(?:i?b)?\s*", text.lower())
    if not m:
        raise typer.BadParameter(
            f"expected a size like 512M or 2G, got {text!r}.", param_hint=option
        )
    return int(float(m.group(1)) * _UNITS[m.group(2)])


def host_warning(host: str, api_key: str | None) -> str | None:
    """The warning for a server reachable from other machines without a key."""
    if host in LOOPBACK or api_key:
        return None
    return (
        f"Listening on {host} without --api-key: anyone who can reach this machine "
        "can use the model. Pass --api-key KEY, or --host 127.0.0.1."
    )


def _load(model, draft, no_draft, draft_bits, out, group=None):
    from dflash_mlx import load, load_draft
    from dflash_mlx.loading.resolve import resolve_models

    from . import ui
    from .session import _timings, _warm_up

    model, draft, note = resolve_models(model, draft, no_draft)
    with ui.loading(out, model):
        target, tokenizer = load(model, distributed=group)
        drafter = None
        if draft:
            # the whole context: the prefix cache then cuts the drafter's KV at any
            # token, where a bounded window allows only its snapshot points
            drafter = load_draft(
                draft,
                target=target,
                bits=draft_bits,
                sliding_window_size=None,
                distributed=group,
            )
        # compiles the kernels; kept timings spare a full calibration (one process)
        timings = _timings(model, draft) if group is None else None
        _warm_up(target, tokenizer, drafter, timings)
    return (target, tokenizer, drafter), (model, draft, note)


def _device_line(group=None) -> str:
    import mlx.core as mx

    from dflash_mlx.backend import blas_in_use

    info = blas_in_use()
    blas = info["name"] + (f" ({info['path']})" if info["path"] else "")
    device = mx.default_device()
    line = f"device {getattr(device.type, 'name', device)} · BLAS {blas}"
    if group is not None:
        line += f" · {group.size} ranks ({group.backend}, {group.sharding} parallel)"
    return line


def serve(
    model: str | None = typer.Option(None, "--model", "-m", help=MODEL_HELP),
    draft: str | None = typer.Option(None, "--draft", "-d", help=DRAFT_HELP),
    no_draft: bool = typer.Option(False, "--no-draft", help="Plain decoding."),
    block_size: str = typer.Option(
        "auto", "--block-size", "-b", help="Verify block size, or 'auto'."
    ),
    draft_bits: int | None = typer.Option(
        None, "--draft-bits", help="Quantize the drafter to 4 or 8 bits."
    ),
    max_tokens: int = typer.Option(
        4096,
        "--max-tokens",
        "-n",
        min=1,
        help="Most tokens one request generates: larger asks are clamped to it; "
        "the default when it names none.",
    ),
    host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on."),
    port: int = typer.Option(8080, "--port", "-p", min=0, max=65535),
    api_key: str | None = typer.Option(
        None,
        "--api-key",
        envvar="DFLASH_MLX_API_KEY",
        help="Require this key (Authorization: Bearer KEY, or x-api-key).",
    ),
    model_name: str | None = typer.Option(
        None, "--model-name", help="Model id to serve under (default: from --model)."
    ),
    strict_model_name: bool = typer.Option(
        False,
        "--strict-model-name",
        help="Answer 404 to other model names (default: any name gets this model).",
    ),
    max_concurrency: int = typer.Option(
        4, "--max-concurrency", min=1, help="Requests generating at once."
    ),
    max_queue: int = typer.Option(
        16, "--max-queue", min=0, help="Requests waiting; beyond it: 503."
    ),
    request_timeout: float = typer.Option(
        600.0, "--request-timeout", min=1.0, help="Seconds per request."
    ),
    prompt_cache_bytes: str = typer.Option(
        "2G",
        "--prompt-cache-bytes",
        help="Prefix cache in RAM: prompts shared by requests and turns (0 = none).",
    ),
    prompt_cache_dir: str | None = typer.Option(
        None,
        "--prompt-cache-dir",
        help="Folder the prefix cache spills to and reloads after a restart.",
    ),
    prompt_cache_disk_bytes: str = typer.Option(
        "8G", "--prompt-cache-disk-bytes", help="Largest size of --prompt-cache-dir."
    ),
    max_kv_bytes: str = typer.Option(
        "auto",
        "--max-kv-bytes",
        help="Caches of the requests decoding together at most; beyond, requests "
        "wait (auto: half the memory).",
    ),
    prefill_chunk: int = typer.Option(
        512,
        "--prefill-chunk",
        min=1,
        help="Prompt tokens prefilled per turn between other requests' blocks.",
    ),
    max_body_bytes: str = typer.Option(
        "16M", "--max-body-bytes", help="Largest request body."
    ),
    temp: float = typer.Option(
        0.0, "--temp", "-t", min=0.0, help="Temperature for requests that set none."
    ),
    log_level: str = typer.Option("warning", "--log-level", help="uvicorn log level."),
    pipeline: bool = options.pipeline(),
    lookup: bool = typer.Option(
        True,
        "--lookup/--no-lookup",
        help="Prompt lookup: copy proposals from the conversation where the text "
        "repeats, chosen per block against the drafter.",
    ),
    kv_bits: str | None = options.kv_bits(),
    kv_group_size: str = options.kv_group_size(),
    trace: str | None = typer.Option(
        None,
        "--trace",
        metavar="PATH",
        help="Append a JSON line per decoding step to PATH: block size, rows, "
        "drafter, upkeep and verify ms (each phase synced to be timed).",
    ),
    web_ui: bool = typer.Option(
        True,
        "--ui/--no-ui",
        help="The dashboard (/ in a browser) and the chat page (/chat); with "
        "--api-key they ask for the key.",
    ),
):
    """Serve the model over HTTP (OpenAI, Anthropic and Responses APIs)."""
    from dflash_mlx.serve.config import ServeConfig

    from . import ui

    out = ui.console()
    group = _join(out, pipeline)
    size = parse_block_size(block_size) or "auto"
    cache = _engine_options(
        prompt_cache_bytes, prompt_cache_dir, prompt_cache_disk_bytes, group
    )
    bits, group_size = options.parse_kv(kv_bits, kv_group_size)
    # alike on every rank; quantized caches decode one request at a time
    cache.update(prefill_chunk=prefill_chunk, lookup=lookup)
    cache.update(kv_bits=bits, kv_group_size=group_size)
    cache["max_kv_bytes"] = _memory_budget(max_kv_bytes)
    cache["trace"] = _trace_path(out, trace)
    body_bytes = parse_bytes(max_body_bytes, "--max-body-bytes")
    warning = host_warning(host, api_key)
    if warning:
        ui.warning(out, warning)
    from dflash_mlx.serve.server import listen

    if group is not None and not group.is_main:
        loaded, _ = _load(model, draft, no_draft, draft_bits, out, group)
        _follow(group, loaded, size, cache)
        return
    try:
        sock = listen(host, port)  # before loading: a busy port fails fast
    except ValueError as e:
        ui.error(out, str(e))
        raise typer.Exit(1) from None
    try:
        loaded, (model_ref, draft_ref, note) = _load(
            model, draft, no_draft, draft_bits, out, group
        )
        config = ServeConfig(
            model_id=model_name or served_name(model_ref),
            draft_id=draft_ref,
            aliases=(model_ref,),
            strict_model_name=strict_model_name,
            block_size=size,
            max_tokens=max_tokens,
            temperature=temp,
            max_concurrency=max_concurrency,
            max_queue=max_queue,
            request_timeout=request_timeout,
            max_body_bytes=body_bytes,
            **cache,
            api_key=api_key,
            ui=web_ui,
        )
        _run(out, loaded, config, note, sock, host, log_level, group)
    except ValueError as e:
        ui.error(out, str(e))
        raise typer.Exit(1) from None
    finally:
        sock.close()
    ui.info(out, "Server stopped.")


def _join(out, pipeline: bool):
    """The ranks' group (None for one process), once the serve extra is known to be
    installed; a clean exit otherwise."""
    from dflash_mlx.serve import MissingExtra, require_serve_extra

    from . import ui
    from .ranks import join

    try:
        require_serve_extra()
        return join(pipeline)
    except (MissingExtra, ValueError) as e:
        ui.error(out, str(e))
        raise typer.Exit(1) from None


def _trace_path(out, path: str | None) -> str | None:
    """--trace: a file that can be written, checked before the model loads."""
    from dflash_mlx.engine.trace import StepTrace

    from . import ui

    if path is None:
        return None
    try:
        StepTrace.open(path).close()
    except ValueError as e:
        ui.error(out, str(e))
        raise typer.Exit(2) from None
    return path


def _memory_budget(text: str) -> int:
    """--max-kv-bytes: a size, or half the machine's memory."""
    import os

    if text != "auto":
        return parse_bytes(text, "--max-kv-bytes")
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2
    except (ValueError, OSError):  # no sysconf: no limit
        return 0


def _engine_options(ram: str, folder: str | None, disk: str, group) -> dict:
    """The ServeConfig fields of the prefix cache."""
    if group is not None and folder is not None:
        raise typer.BadParameter(
            "is not supported on several ranks yet: leave it out (the prefix cache "
            "then stays in RAM).",
            param_hint="--prompt-cache-dir",
        )
    return dict(
        prompt_cache_bytes=parse_bytes(ram, "--prompt-cache-bytes"),
        prompt_cache_dir=folder,
        prompt_cache_disk_bytes=parse_bytes(disk, "--prompt-cache-disk-bytes"),
    )


def _run(out, loaded, config, note, sock, host, log_level, group=None):
    from dflash_mlx.serve.app import create_app
    from dflash_mlx.serve.mirror import Mirror
    from dflash_mlx.serve.server import run_server

    from . import ui

    app = create_app(*loaded, config, Mirror(group) if group is not None else None)
    ui.serve_banner(out, config, note, _device_line(group))
    run_server(
        app,
        sock,
        log_level=log_level,
        on_ready=lambda port: ui.serve_ready(out, _url(host, port), config),
    )


def _follow(group, loaded, block_size, cache: dict):
    """A rank other than 0: no HTTP, the same engine moves as rank 0."""
    from dflash_mlx.engine.loop import as_target
    from dflash_mlx.generate import wrap_tokenizer
    from dflash_mlx.serve.config import ServeConfig
    from dflash_mlx.serve.mirror import follow
    from dflash_mlx.serve.scheduler import Job
    from dflash_mlx.serve.state import build_engine

    model, tokenizer, draft = loaded
    cache = {**cache, "trace": None}  # rank 0 traces the steps
    config = ServeConfig(model_id="follower", block_size=block_size, **cache)
    target = as_target(model, draft)
    engine = build_engine(target, wrap_tokenizer(tokenizer), draft, config, True)
    follow(group, engine, lambda job: Job(**{**job, **_tuples(job)}))


def _tuples(job: dict) -> dict:
    """A Job's tuple fields back from JSON lists."""
    return {k: tuple(job[k]) for k in ("prompt", "boundaries")}


def _url(host: str, port: int) -> str:
    shown = "127.0.0.1" if host in ("0.0.0.0", "") else host
    return f"http://{f'[{shown}]' if ':' in shown else shown}:{port}/v1"


def served_name(model_ref: str) -> str:
    """A short model id: the folder or file name, or the Hub repo id as it is."""
    from pathlib import Path

    path = Path(model_ref).expanduser()
    if path.exists():
        return path.stem if path.is_file() else path.name
    return model_ref
