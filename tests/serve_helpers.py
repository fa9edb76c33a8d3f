"""Real uvicorn servers on 127.0.0.1 for the serve tests, and what drives them."""

import threading
import time
from pathlib import Path

import httpx
from oracles import OracleDraft

from dflash_mlx.generate import stream_generate
from dflash_mlx.models.draft import Model
from dflash_mlx.serve.app import create_app
from dflash_mlx.serve.config import ServeConfig
from dflash_mlx.serve.server import listen, make_server


class LiveServer:
    """`create_app` under uvicorn on a free port, in a background thread."""

    def __init__(self, model, tokenizer, draft, port: int = 0, **config):
        config.setdefault("model_id", "tiny")
        self.app = create_app(model, tokenizer, draft, ServeConfig(**config))
        self.sock = listen("127.0.0.1", port)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.server = make_server(self.app, self.sock)
        self.thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True
        )

    @property
    def state(self):
        return self.app.state.server

    def __enter__(self):
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            assert time.monotonic() < deadline, "the server did not start"
            time.sleep(0.02)
        return self

    def __exit__(self, *exc):
        self.server.should_exit = True
        self.thread.join(30)
        self.sock.close()

    def wait_idle(self, timeout: float = 10.0):
        """Until no request is generating or waiting (a cancel lags up to a block)."""
        scheduler = self.state.scheduler
        deadline = time.monotonic() + timeout
        while scheduler.active or scheduler.waiting:
            assert time.monotonic() < deadline, "the engine did not go idle"
            time.sleep(0.02)


class FailingOracle(OracleDraft):
    """An oracle drafter that raises once the context is longer than `fail_beyond`."""

    def __init__(self, args, reference, fail_beyond: int):
        super().__init__(args, reference)
        self.fail_beyond = fail_beyond

    def __call__(self, block_embeddings, cache):
        positions = getattr(cache[0], "positions", None) or (cache[0].offset,)
        if max(positions) > self.fail_beyond:
            raise RuntimeError("injected drafter failure")
        return super().__call__(block_embeddings, cache)


def chat_ids(tokenizer, messages, **template_kwargs) -> list[int]:
    text = tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=False, **template_kwargs
    )
    return tokenizer.encode(text, add_special_tokens=False)


def reference(model, draft, tokenizer, ids, max_tokens: int) -> tuple[list[int], str]:
    """(tokens, text) that `dflash_mlx.generate` gives for `ids` (greedy)."""
    tokens, text = [], ""
    for r in stream_generate(model, draft, tokenizer, ids, max_tokens=max_tokens):
        tokens += r.tokens
        text += r.text
    return tokens, text


def sse_events(response) -> list[tuple[str | None, str]]:
    """(event name, data) of every server-sent event in an httpx streaming response."""
    events, name = [], None
    for line in response.iter_lines():
        if line.startswith("event: "):
            name = line[len("event: ") :]
        elif line.startswith("data: "):
            events.append((name, line[len("data: ") :]))
            name = None
    return events


class SlowDraft(Model):
    """A drafter that sleeps before every draft: holds a request in flight for as
    long as a test needs, without spending CPU."""

    def __init__(self, args, seconds: float):
        super().__init__(args)
        self.seconds = seconds

    def __call__(self, block_embeddings, cache):
        time.sleep(self.seconds)
        return super().__call__(block_embeddings, cache)


def copy_weights(double, draft):
    """`double` (a drafter test double) with `draft`'s weights."""
    double.update(draft.parameters())
    return double


def agent_pair(folder: Path, style: str = "qwen3") -> tuple[Path, Path]:
    """(target, drafter) folders of the scripted agent in `style`
    (examples/scripted_agent.py) in `folder`, built once."""
    from scripted_agent import make_scripted_target
    from tiny import make_draft

    target, draft = folder / f"agent-{style}", folder / f"agent-{style}-draft"
    if not (target / "config.json").exists():  # written last
        make_scripted_target(target, style)
    if not (draft / "config.json").exists():
        make_draft(draft, target, num_layers=1, max_position_embeddings=65536)
    return target, draft


class PrefillGate:
    """Holds every prompt's prefill before its second chunk while closed (the engine
    thread waits there, 10 s at most): a test sees what a client gets mid-prefill,
    then opens it. Open at first."""

    def __init__(self, engine):
        self.opened = threading.Event()
        self.opened.set()
        self._prefill = engine.prefill
        engine.prefill = self  # this engine's own attribute: the scheduler calls it

    def __call__(self, seq):
        assert seq.cache is not None
        if len(seq.cache.tokens) > seq.reused and not self.opened.wait(10):
            self.opened.set()  # nobody opened it: the test fails on its own
        return self._prefill(seq)

    def close(self):
        self.opened.clear()

    def open(self):
        self.opened.set()


class Tee:
    """Keeps the raw bytes of every response a client it made reads, and opens `gate`
    as soon as `marker` went by (a keep-alive reached the client)."""

    def __init__(self, gate: PrefillGate, marker: bytes):
        self.gate, self.marker, self.raw = gate, marker, b""

    def seen(self, chunk: bytes):
        self.raw += chunk
        if self.marker in self.raw:
            self.gate.open()

    def client(self, http=httpx):
        """An `http.Client` that reads through this tee (`http`: httpx, or httpx2
        for the anthropic SDK)."""
        tee = self

        class Stream(http.SyncByteStream):
            def __init__(self, inner):
                self.inner = inner

            def __iter__(self):
                for chunk in self.inner:
                    tee.seen(chunk)
                    yield chunk

            def close(self):
                self.inner.close()

        class Transport(http.HTTPTransport):
            def handle_request(self, request):
                response = super().handle_request(request)
                return http.Response(
                    response.status_code,
                    headers=response.headers,
                    stream=Stream(response.stream),
                    extensions=response.extensions,
                )

        return http.Client(transport=Transport(), timeout=30)


class BlockClock:
    """Notes when each verified block reaches the HTTP side (`times`, time.time()),
    for as long as it is attached to `metrics` (a `with` block)."""

    def __init__(self, metrics):
        self.metrics, self.times = metrics, []
        self._observe = metrics.observe_block

    def __call__(self, event):
        self._observe(event)
        if not event.first:
            self.times.append(time.time())

    def __enter__(self):
        self.metrics.observe_block = self  # this Metrics' own attribute
        return self

    def __exit__(self, *exc):
        del self.metrics.observe_block
