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
    output: object  # toolformats.OutputFormat: the family's reasoning and tool calls
    raw_output: object  # one with no markers (raw completions)
    context_length: int | None
    history: object = None  # serve/history.History: answers' ids, for resent text
    grammars: object = None  # structured.Grammars, built by the first grammar asked

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
    """Wrap the loaded pair and make the engine, its prefix cache and the metrics."""
    from mlx_lm.generate import TextStateMachine

    from ..engine.loop import as_target
    from ..generate import wrap_tokenizer
    from ..loading.resolve import context_length
    from .history import History
    from .metrics import Metrics
    from .scheduler import Scheduler
    from .toolformats import OutputFormat, output_format

    if draft is not None:
        from ..loading import check_compatible

        check_compatible(model, draft)
    target = as_target(model, draft)
    tokenizer = wrap_tokenizer(tokenizer)
    engine = build_engine(target, tokenizer, draft, config)
    scheduler = Scheduler(
        engine,
        max_concurrency=config.max_concurrency,
        max_queue=config.max_queue,
        timeout=config.request_timeout,
        mirror=mirror,
        max_kv_bytes=config.max_kv_bytes,
    )
    max_block = draft.args.block_size if draft is not None else 1
    return ServerState(
        target=target,
        tokenizer=tokenizer,
        draft=draft,
        config=config,
        scheduler=scheduler,
        metrics=Metrics(scheduler, max_block),
        output=output_format(tokenizer),
        raw_output=OutputFormat("raw", TextStateMachine(), None),
        context_length=context_length(target.model),
        history=History(),
    )


def build_engine(target, tokenizer, draft, config: ServeConfig, follower=False):
    """The engine, with one block-size policy for every request (what it learns
    carries over) and the prefix cache (a follower rank's keeps what rank 0 keeps)."""
    import sys

    from ..engine.policy import AdaptiveBlockSize
    from ..engine.trace import StepTrace
    from ..generate import make_prompt_cache
    from ..models.prefix import PrefixStore
    from .engine import ServeEngine

    block_size: int | str | AdaptiveBlockSize = (
        config.block_size if draft is not None else 1
    )
    if block_size == "auto":
        block_size = AdaptiveBlockSize.for_drafter(draft)
    budget = config.prompt_cache_bytes
    if follower and budget:
        budget = sys.maxsize  # it forgets what rank 0's store evicts, no more
    spill = None if follower else open_spill(target, draft, config)
    kv = (config.kv_bits, config.kv_group_size)
    # whole histories: the prefix store cuts a cache at any token
    store = PrefixStore(
        lambda: make_prompt_cache(target, draft, *kv, windows=False), budget, spill
    )
    stops = frozenset(tokenizer.eos_token_ids)
    return ServeEngine(
        target,
        draft,
        stops,
        store,
        block_size,
        prefill_chunk=config.prefill_chunk,
        lookup=config.lookup,
        trace=None if config.trace is None else StepTrace.open(config.trace),
    )


def open_spill(target, draft, config: ServeConfig):
    """The disk side of the prefix cache (--prompt-cache-dir), or None."""
    import logging

    from .. import __version__
    from ..models.prefix_disk import DiskSpill, FolderBusy, fingerprint

    if config.prompt_cache_dir is None or not config.prompt_cache_disk_bytes:
        return None
    kv = f"{config.kv_bits}/{config.kv_group_size}" if config.kv_bits else ""
    mark = fingerprint(target, draft, __version__, kv)
    try:
        return DiskSpill(config.prompt_cache_dir, config.prompt_cache_disk_bytes, mark)
    except FolderBusy as e:
        logging.getLogger("dflash_mlx.serve").warning(
            "%s The prompt cache stays in RAM only.", e
        )
        return None
