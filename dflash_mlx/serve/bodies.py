"""Reading request bodies: a byte limit, JSON decoding and schema validation, each with
a 4xx that says what to fix."""

import json

from .errors import ApiError
from .schemas import parse_body


def _too_large(limit: int) -> ApiError:
    return ApiError(
        413,
        f"The request body is over this server's limit of {limit} bytes "
        "(--max-body-bytes): send less, or raise the limit.",
        code="request_too_large",
    )


async def read_json(request, limit: int):
    """The decoded JSON body, read at most `limit` bytes far."""
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > limit:
        raise _too_large(limit)
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise _too_large(limit)
    try:
        return json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ApiError(
            400,
            f"The request body is not valid JSON ({e}): send a JSON object.",
            code="invalid_json",
        ) from None


async def read_request(request, model):
    """The body validated against the pydantic `model`."""
    state = request.app.state.server
    return parse_body(model, await read_json(request, state.config.max_body_bytes))
