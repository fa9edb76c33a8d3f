"""Everything the routes share: the loaded pair, the engine, metrics and the config."""

from dataclasses import dataclass

from .config import ServeConfig
from .errors import ApiError


@dataclass
class ServerState:
    target: object  # dflash_mlx.Target
    tokenizer: object  # mlx-lm TokenizerWrapper
    draft: object | None
    config: ServeConfig
    scheduler: object
    metrics: object
    machine: object  # TextStateMachine with the tokenizer's reasoning/tool markers
    raw_machine: object  # one with no markers (raw completions)
    context_length: int | None

    def check_model(self, name: str | None):
        """404 unless `name` (when given) is the served model or one of its aliases."""
        cfg = self.config
        if name is None or name == cfg.model_id or name in cfg.aliases:
            return
        raise ApiError(
            404,
            f"The model '{name}' does not exist here: this server serves "
            f"'{cfg.model_id}' (GET /v1/models).",
            param="model",
            code="model_not_found",
        )


def build_state(
    model, tokenizer, draft, config: ServeConfig, mirror=None
) -> ServerState:
    """Wrap the loaded pair and make the engine, its prompt pool and the metrics."""
    from mlx_lm.generate import TextStateMachine, make_text_state_machine

    from ..engine.loop import as_target
    from ..engine.policy import AdaptiveBlockSize
    from ..generate import make_prompt_cache, wrap_tokenizer
    from ..loading.resolve import context_length
    from .metrics import Metrics
    from .prompt_pool import PromptPool
    from .scheduler import Scheduler

    if draft is not None:
        from ..loading import check_compatible

        check_compatible(model, draft)
    target = as_target(model, draft)
    tokenizer = wrap_tokenizer(tokenizer)
    block_size: int | str | AdaptiveBlockSize = (
        config.block_size if draft is not None else 1
    )
    if block_size == "auto":  # one policy for all requests: what it learns carries over
        block_size = AdaptiveBlockSize.for_drafter(draft)
    pool = PromptPool(
        lambda: make_prompt_cache(target, draft), config.prompt_cache_bytes
    )
    scheduler = Scheduler(
        target,
        tokenizer,
        draft,
        pool,
        block_size=block_size,
        max_concurrency=config.max_concurrency,
        max_queue=config.max_queue,
        timeout=config.request_timeout,
        mirror=mirror,
    )
    max_block = draft.args.block_size if draft is not None else 1
    return ServerState(
        target=target,
        tokenizer=tokenizer,
        draft=draft,
        config=config,
        scheduler=scheduler,
        metrics=Metrics(scheduler, max_block),
        machine=make_text_state_machine(tokenizer),
        raw_machine=TextStateMachine(),
        context_length=context_length(target.model),
    )
