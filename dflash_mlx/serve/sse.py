"""Server-sent events: framing and the streaming response that carries them."""

import json

DONE = "data: [DONE]\n\n"


def sse(data: dict, event: str | None = None) -> str:
    """One event; `event` names it (Anthropic and Responses streams do)."""
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {json.dumps(data, ensure_ascii=False)}\n\n"


def comment(text: str) -> str:
    """A comment line: every SSE parser skips it (the OpenAI streams' keep-alive)."""
    return f": {text}\n\n"


PING = sse({"type": "ping"}, "ping")  # Anthropic's own keep-alive event


def event_stream(chunks):
    """A streaming response for an async iterator of SSE strings."""
    from fastapi.responses import StreamingResponse

    return StreamingResponse(
        chunks,
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )
