"""Server options (the `dflash-mlx serve` flags), as one value the app is built from."""

from dataclasses import dataclass

from .errors import ApiError


@dataclass(frozen=True)
class ServeConfig:
    model_id: str  # the name /v1/models lists and requests use
    draft_id: str | None = None
    aliases: tuple[str, ...] = ()  # other model names requests may use
    strict_model_name: bool = False  # a name not served is a 404 (else: served anyway)
    block_size: int | str = "auto"
    lookup: bool = True  # prompt lookup beside the drafter, chosen per block
    max_tokens: int = 4096  # cap per request (larger asks are clamped), and the default
    temperature: float = 0.0  # defaults for requests that give no sampling values
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    max_concurrency: int = 4
    max_queue: int = 16
    request_timeout: float = 600.0  # seconds, queueing included
    prompt_cache_bytes: int = 2 << 30  # the prefix cache in RAM (0: none)
    prompt_cache_dir: str | None = None  # where it spills to disk (None: RAM only)
    prompt_cache_disk_bytes: int = 8 << 30
    prefill_chunk: int = 512  # prompt tokens a turn, between the decoding steps
    max_kv_bytes: int = 0  # the decoding batch's caches at most (0: no limit)
    max_body_bytes: int = 16 << 20
    api_key: str | None = None
    ui: bool = True  # the dashboard (GET /) and the chat page (GET /chat); --no-ui
    # the target's attention KV cache quantized (None: float); requests then decode
    # one at a time, each on its own caches (the batch's caches are float)
    kv_bits: int | None = None
    kv_group_size: int = 64
    trace: str | None = None  # a file for a JSON line per batch step (engine/trace.py)

    def __post_init__(self):
        from ..validate import kv_quantization

        kv_quantization(self.kv_bits, self.kv_group_size)
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}.")
        if self.prefill_chunk < 1:
            raise ValueError(f"prefill_chunk must be >= 1, got {self.prefill_chunk}.")
        if self.max_body_bytes < 1024:
            raise ValueError(
                f"max_body_bytes must be at least 1024, got {self.max_body_bytes}."
            )

    def served_model(self, name: str | None) -> str:
        """The model id a request for `name` is answered by. Agents send their own
        model names (Claude Code its `claude-...` default), so any name gets the one
        model; with `strict_model_name`, a name not served is a 404."""
        if (
            not self.strict_model_name
            or name is None
            or name == self.model_id
            or name in self.aliases
        ):
            return self.model_id
        raise ApiError(
            404,
            f"The model '{name}' does not exist here: this server serves "
            f"'{self.model_id}' (GET /v1/models) and was started with "
            "--strict-model-name.",
            param="model",
            code="model_not_found",
        )
