"""The FastAPI app: routes, API-key check, error shapes, /health and /metrics, and the
server's own pages (serve/dashboard.py)."""

import hmac
from contextlib import asynccontextmanager

from . import require_serve_extra
from .config import ServeConfig
from .errors import ApiError, error_body

ENDPOINTS = {
    "/v1/chat/completions": "chat",
    "/v1/completions": "completions",
    "/v1/messages": "messages",
    "/v1/messages/count_tokens": "count_tokens",
    "/v1/responses": "responses",
}
OPEN_PATHS = ("/", "/health")


def endpoint_name(path: str) -> str:
    return ENDPOINTS.get(path, "other")


def error_response(err: ApiError, path: str):
    from fastapi.responses import JSONResponse

    return JSONResponse(error_body(err, path), err.status, headers=err.headers)


class ApiKeyCheck:
    """ASGI middleware: every route except /, /health and the pages' static files
    (`open_paths`, no data in any) needs the key, as `Authorization: Bearer KEY` or
    (Anthropic clients) `x-api-key: KEY`."""

    def __init__(self, app, key: str, metrics, open_paths=OPEN_PATHS):
        self.app, self.key, self.metrics = app, key.encode(), metrics
        self.open_paths = frozenset(open_paths)

    def _authorized(self, headers: dict) -> bool:
        bearer = headers.get(b"authorization", b"")
        offered = [headers.get(b"x-api-key", b"")]
        if bearer.lower().startswith(b"bearer "):
            offered.append(bearer[7:].strip())
        return any(hmac.compare_digest(k, self.key) for k in offered)

    async def __call__(self, scope, receive, send):
        path = scope.get("path", "")
        if (
            scope["type"] != "http"
            or path in self.open_paths
            or self._authorized(dict(scope["headers"]))
        ):
            return await self.app(scope, receive, send)
        self.metrics.count(endpoint_name(path), "unauthorized")
        err = ApiError(
            401,
            "Missing or wrong API key: send 'Authorization: Bearer KEY' "
            "(Anthropic clients: 'x-api-key: KEY') with the server's --api-key.",
            code="invalid_api_key",
        )
        await error_response(err, path)(scope, receive, send)


def _add_error_handlers(app, state):
    from fastapi import Request
    from fastapi.responses import Response
    from starlette.exceptions import HTTPException

    from .runner import ClientGone

    @app.exception_handler(ApiError)
    async def api_error(request: Request, err: ApiError):
        if not err.counted:
            state.metrics.count(endpoint_name(request.url.path), err.metric_status)
        return error_response(err, request.url.path)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException):
        hint = {
            404: f"No route {request.url.path}: see GET /v1/models and the docs.",
            405: f"{request.method} is not allowed on {request.url.path}.",
        }.get(exc.status_code, str(exc.detail))
        return error_response(ApiError(exc.status_code, hint), request.url.path)

    @app.exception_handler(ClientGone)
    async def client_gone(request: Request, exc: ClientGone):
        return Response(status_code=499)  # nobody reads it

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception):
        state.metrics.count(endpoint_name(request.url.path), "error")
        err = ApiError(500, f"Internal error ({type(exc).__name__}: {exc}).")
        return error_response(err, request.url.path)


def _add_service_routes(app, state):
    from fastapi import Request
    from fastapi.responses import Response

    from . import dashboard

    @app.api_route("/", methods=["GET", "HEAD"])
    async def root(request: Request):
        # a browser gets the dashboard; clients probe it (Claude Code sends HEAD /
        # first) and get JSON
        if (
            state.config.ui
            and request.method == "GET"
            and dashboard.wants_html(request)
        ):
            return dashboard.page(dashboard.PAGES["/"])
        return {"status": "ok", "api": "/v1"}

    @app.get("/health")
    async def health():
        s, cfg = state.scheduler, state.config
        return {
            "status": "ok",
            "model": cfg.model_id,
            "draft": cfg.draft_id,
            "context_length": state.context_length,
            "active": s.active,
            "queue_depth": s.waiting,
            "max_concurrency": cfg.max_concurrency,
            "max_queue": cfg.max_queue,
            "prompt_cache": s.engine.cache_report(),
        }

    @app.get("/metrics")
    async def metrics():
        body, media_type = state.metrics.render()
        return Response(body, media_type=media_type)


def create_app(model, tokenizer, draft, config: ServeConfig, mirror=None):
    """A FastAPI app serving `model` (and `draft`); the engine thread runs while the
    app is up (its lifespan). `mirror` (rank 0 of a sharded target) tells the other
    ranks what the engine does."""
    require_serve_extra()
    from fastapi import FastAPI

    from .. import __version__
    from . import anthropic_routes, openai_routes, responses_routes
    from .state import build_state

    state = build_state(model, tokenizer, draft, config, mirror)

    @asynccontextmanager
    async def lifespan(app):
        state.scheduler.start()
        try:
            yield
        finally:
            state.scheduler.stop()

    app = FastAPI(
        title="dflash-mlx",
        version=__version__,
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
    )
    app.state.server = state
    _add_error_handlers(app, state)
    _add_service_routes(app, state)
    for module in (openai_routes, anthropic_routes, responses_routes):
        app.include_router(module.router)
    open_paths: tuple[str, ...] = OPEN_PATHS
    if config.ui:
        from . import dashboard

        app.include_router(dashboard.router(state))
        open_paths += dashboard.OPEN_PATHS
    if config.api_key:
        app.add_middleware(
            ApiKeyCheck,
            key=config.api_key,
            metrics=state.metrics,
            open_paths=open_paths,
        )
    return app
