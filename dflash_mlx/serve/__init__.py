"""`dflash-mlx serve`: OpenAI-, Anthropic- and Responses-compatible HTTP server.

A thin layer over the engine: `scheduler` owns every MLX call on one thread and speaks
token ids; the route modules turn HTTP requests into token ids and blocks of committed
ids back into each API's wire format. Needs FastAPI, uvicorn, pydantic and
prometheus-client (dependencies of the install; `require_serve_extra` names the fix
where one is missing anyway). May import anything of the library below the commands
(the text API, loading, the engine, models, base modules); never bench/, chat/, train/
or cli/.
"""

SERVE_EXTRA_FIX = "pip install fastapi uvicorn pydantic prometheus-client"
_SERVE_MODULES = ("fastapi", "uvicorn", "pydantic", "prometheus_client")


class MissingExtra(RuntimeError):
    """A server dependency is missing; the message says how to install it."""


def require_serve_extra():
    """Raise MissingExtra naming the fix when a server dependency cannot be imported."""
    import importlib

    missing = []
    for name in _SERVE_MODULES:
        try:
            importlib.import_module(name)
        except ImportError:
            missing.append(name)
    if missing:
        raise MissingExtra(
            f"The server needs {', '.join(missing)}: install it with "
            f"`{SERVE_EXTRA_FIX}`."
        )
