"""API errors as sent: OpenAI's error object; Anthropic's on /v1/messages."""

_OPENAI_TYPES = {
    400: "invalid_request_error",
    401: "invalid_request_error",
    404: "invalid_request_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    500: "server_error",
    503: "server_error",
    504: "server_error",
}
_ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "request_too_large",
    500: "api_error",
    503: "overloaded_error",
    504: "api_error",
}


class ApiError(Exception):
    """An error answered with `status` and a message that says how to fix it."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        headers: dict | None = None,
    ):
        super().__init__(message)
        self.status, self.message = status, message
        self.param, self.code = param, code
        self.headers = headers or {}
        self.counted = False  # already in /metrics (errors of a running generation)

    @property
    def metric_status(self) -> str:
        """The outcome label /metrics counts this error under."""
        if self.status == 503:
            return "overloaded"
        if self.status == 504:
            return "timeout"
        if self.status == 401:
            return "unauthorized"
        return "invalid" if self.status < 500 else "error"


def openai_error(err: ApiError) -> dict:
    return {
        "error": {
            "message": err.message,
            "type": _OPENAI_TYPES.get(err.status, "invalid_request_error"),
            "param": err.param,
            "code": err.code,
        }
    }


def anthropic_error(err: ApiError) -> dict:
    kind = _ANTHROPIC_TYPES.get(err.status, "invalid_request_error")
    return {"type": "error", "error": {"type": kind, "message": err.message}}


def is_anthropic_path(path: str) -> bool:
    return path.startswith("/v1/messages")


def error_body(err: ApiError, path: str) -> dict:
    """The error object in the shape of the API that `path` belongs to."""
    return anthropic_error(err) if is_anthropic_path(path) else openai_error(err)
