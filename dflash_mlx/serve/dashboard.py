"""The server's own pages: the dashboard (GET / from a browser) and the chat (GET
/chat), from static files shipped in serve/ui/ (no build step, nothing from a CDN),
and the data the dashboard reads: one snapshot (GET /ui/api/snapshot) or a stream of
them (GET /ui/api/events, server-sent events, at most one a second).

The pages and their scripts hold no data: anyone may load them. Everything they show
comes from the data routes and the API, which need the key like every other route
when the server has one (`--api-key`). A snapshot is built from what the server keeps
anyway: the /metrics registry (its samples as /metrics writes them), the requests'
usage and `x_dflash` numbers, the prefix cache's report; the engine thread does no
work for the page. `--no-ui` serves none of it.
"""

import asyncio
import time
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from .sse import event_stream, sse

UI_DIR = Path(__file__).parent / "ui"
PAGES = {"/": "index.html", "/chat": "chat.html"}
ASSETS = {
    "common.js": "text/javascript; charset=utf-8",
    "dashboard.js": "text/javascript; charset=utf-8",
    "chat.js": "text/javascript; charset=utf-8",
    "style.css": "text/css; charset=utf-8",
}
# the paths that need no key: the pages and their files (no data in any of them)
OPEN_PATHS = ("/chat", *(f"/ui/{name}" for name in ASSETS))
# Scripts and styles from this server only, no inline ones: text a model wrote that
# slipped into the page as markup still could not run.
HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' "
        "data:; connect-src 'self'; base-uri 'none'; form-action 'none'; "
        "frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}
MIN_GAP_S = 1.0  # a stream sends at most one snapshot a second ...
IDLE_GAP_S = 5.0  # ... and one every 5 s when nothing moved (uptime, the plot)
TICK_S = 0.1  # how often a stream looks for a change
PLAIN_WINDOW_S = 10  # "decoding plainly": no proposals verified in these seconds


def wants_html(request: Request) -> bool:
    """A browser's GET (it asks for text/html); API clients probing / get JSON."""
    return "text/html" in request.headers.get("accept", "")


def _file(name: str, media_type: str) -> Response:
    return Response(
        (UI_DIR / name).read_bytes(), media_type=media_type, headers=HEADERS
    )


def page(name: str) -> Response:
    return _file(name, "text/html; charset=utf-8")


def server_info(state) -> dict:
    """What does not change while the server runs: the pair, the engine's settings,
    the kernels and the device."""
    import mlx.core as mx

    from .. import __version__
    from ..backend import blas_in_use

    cfg, draft = state.config, state.draft
    mode = "dflash" if draft is not None else "lookup" if cfg.lookup else "plain"
    kernels = {"target": getattr(getattr(state.target, "kernels", None), "name", None)}
    if draft is not None:
        kernels["draft"] = getattr(getattr(draft, "kernels", None), "name", None)
    device = mx.default_device()
    try:
        blas = blas_in_use()["name"]
    except Exception:  # a probe that fails must not take the page down
        blas = None
    group = getattr(state.target, "group", None)
    return {
        "version": __version__,
        "model": cfg.model_id,
        "draft": cfg.draft_id,
        "mode": mode,  # "dflash", "lookup" (no drafter) or "plain"
        "block_size": cfg.block_size if draft is not None else 1,
        "max_block": draft.args.block_size if draft is not None else 1,
        "lookup": cfg.lookup,
        "kernels": kernels,
        "device": getattr(device.type, "name", str(device)),
        "blas": blas,
        "ranks": group.size if group is not None else 1,
        "max_concurrency": cfg.max_concurrency,
        "max_queue": cfg.max_queue,
        "max_tokens": cfg.max_tokens,
        "temperature": cfg.temperature,
        "kv_bits": cfg.kv_bits,
        "context_length": state.context_length,
        "started": time.time(),
    }


def plain_reason(state) -> str:
    """Why the blocks verify no proposals: the setup, or what the block-size policy
    measured."""
    from ..engine.sources import FixedBlockSize

    cfg = state.config
    if state.draft is None:
        if not cfg.lookup:
            return (
                "No drafter (--no-draft) and prompt lookup off (--no-lookup): one "
                "token per target forward."
            )
        return (
            "No drafter (--no-draft): a block verifies a copy from the conversation "
            "where the text repeats (prompt lookup), and lately nothing repeated."
        )
    policy: Any = getattr(state.scheduler.engine.decoding, "policy", None)
    policy = getattr(policy, "policy", policy)  # several ranks: rank 0's own
    if isinstance(policy, FixedBlockSize):
        if policy.size == 1:
            return "--block-size 1: plain decoding, one token per target forward."
        return "Every recent block was a request's last token (no block runs past it)."
    text = (
        "The block-size policy measured plain decoding as the fastest here on the "
        "recent text"
    )
    try:  # read from another thread: a torn read only loses the numbers
        plain = policy.rate(1)
        drafted = [(policy.rate(s), s) for s in policy.sizes if s > 1]
        rate, size = max((r, s) for r, s in drafted if r is not None)
        tau = policy.block_tokens(size)
        if plain:
            text += (
                f": {plain:.1f} tok/s plain against {rate:.1f} at block {size} "
                f"(τ {tau:.2f} expected)"
            )
    except Exception:
        pass
    return text + "; it tries drafting again now and then."


def decoding_state(state, info: dict, blocks: list) -> dict:
    """Whether the recent blocks decoded plainly (no proposal verified) and why."""
    recent = blocks[-PLAIN_WINDOW_S:]
    proposed = sum(b[0] for b in recent)
    plain_blocks = sum(b[1] for b in recent)
    plain = info["mode"] == "plain" or (plain_blocks > 0 and proposed == 0)
    return {
        "window_s": PLAIN_WINDOW_S,
        "proposed_blocks": proposed,
        "plain_blocks": plain_blocks,
        "plain": plain,
        "why": plain_reason(state) if plain else None,
    }


def snapshot(state, info: dict) -> dict:
    """Everything the dashboard shows, as one JSON-able dict."""
    metrics, scheduler = state.metrics, state.scheduler
    _, tokens, blocks = metrics.tokens_per_second()
    running = sorted(list(metrics.live.values()), key=lambda g: g.number)
    return {
        "time": time.time(),
        "server": {**info, "uptime_s": time.time() - info["started"]},
        "metrics": metrics.samples(),
        "prompt_cache": scheduler.engine.cache_report(),
        "tokens_per_second": tokens,
        "decoding": decoding_state(state, info, blocks),
        "requests": {
            "running": [g.record() for g in running],
            "recent": list(reversed(metrics.recent)),
        },
    }


async def snapshots(state, info: dict):
    """The dashboard's stream: a snapshot as soon as something moved (a block, a
    request in or out), at most one a second, and one every IDLE_GAP_S anyway;
    it ends when the server stops (the page reconnects)."""
    metrics, scheduler = state.metrics, state.scheduler
    sent_at, sent = float("-inf"), None
    yield "retry: 2000\n\n"
    while not scheduler.stopping:
        mark = (metrics.version, scheduler.active, scheduler.waiting)
        due = sent_at + (MIN_GAP_S if mark != sent else IDLE_GAP_S)
        now = time.monotonic()
        if now >= due:
            yield sse(snapshot(state, info))
            sent_at, sent = now, mark
        else:
            await asyncio.sleep(min(due - now, TICK_S))


def router(state) -> APIRouter:
    """The pages, their files and the data routes."""
    info = server_info(state)
    r = APIRouter()
    no_store = {"Cache-Control": "no-store"}

    @r.get("/chat")
    async def chat_page():
        return page(PAGES["/chat"])

    @r.get("/ui/{name}")
    async def asset(name: str):
        from starlette.exceptions import HTTPException

        if name not in ASSETS:
            raise HTTPException(404)  # as any other unknown path
        return _file(name, ASSETS[name])

    @r.get("/ui/api/snapshot")
    async def one_snapshot():
        from fastapi.responses import JSONResponse

        return JSONResponse(snapshot(state, info), headers=no_store)

    @r.get("/ui/api/events")
    async def events():
        return event_stream(snapshots(state, info))

    return r
