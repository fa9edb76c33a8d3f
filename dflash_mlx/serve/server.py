"""Running the app under uvicorn: our own listening socket (a clear error for a busy
port), and a clean stop on Ctrl-C/SIGTERM: in-flight streams end with an error event,
then the process exits normally."""

import signal
import socket
import threading
from collections.abc import Callable


def listen(host: str, port: int) -> socket.socket:
    """A listening socket; ValueError with a fix when the address is unusable."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # proto=TCP: asyncio then sets TCP_NODELAY on each connection; without it a
    # response's header and body segments wait ~40 ms for a delayed ACK
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(128)
    except OSError as e:
        sock.close()
        raise ValueError(
            f"Cannot listen on {host}:{port} ({e.strerror}): pick another --port, "
            "or stop the program using it."
        ) from e
    return sock


def make_server(app, sock: socket.socket, log_level: str = "warning", on_ready=None):
    """A uvicorn server for `app` on `sock` whose exit signal first ends every job."""
    import uvicorn

    class Server(uvicorn.Server):
        async def startup(self, sockets=None):
            await super().startup(sockets)
            if self.started and on_ready is not None:
                on_ready(sock.getsockname()[1])

        def handle_exit(self, sig, frame):
            app.state.server.scheduler.shutdown()  # streams get an error event now
            super().handle_exit(sig, frame)

    config = uvicorn.Config(
        app,
        log_level=log_level,
        timeout_graceful_shutdown=10,
        lifespan="on",
        access_log=log_level in ("debug", "info"),
    )
    return Server(config)


def run_server(
    app,
    sock: socket.socket,
    *,
    log_level: str = "warning",
    on_ready: Callable[[int], None] | None = None,
):
    """Serve on `sock` (from `listen`) until Ctrl-C or SIGTERM; returns normally after
    a clean shutdown. `on_ready(port)` runs once connections are accepted."""
    server = make_server(app, sock, log_level, on_ready)
    previous = {}
    if threading.current_thread() is threading.main_thread():
        # uvicorn re-raises the signal that stopped it once it is done; a no-op
        # handler underneath makes that a normal exit (status 0) instead of a kill
        for sig in (signal.SIGINT, signal.SIGTERM):
            previous[sig] = signal.signal(sig, lambda *_: None)
    try:
        server.run(sockets=[sock])
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        sock.close()
