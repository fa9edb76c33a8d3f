"""Which target and drafter to load: command-line names, the built-in pair, the
registry.

Nothing here loads weights; `targets.py` and `drafters.py` do, from the names chosen
here.
"""

from types import ModuleType


def _optional(module: str) -> ModuleType | None:
    """`dflash_mlx.loading.<module>`, or None when that module is not part of this
    build."""
    from importlib import import_module

    try:
        return import_module(f"{__package__}.{module}")
    except ModuleNotFoundError as e:
        if e.name != f"{__package__}.{module}":
            raise
        return None


def resolve_models(model: str | None, draft: str | None, no_draft: bool = False):
    """(target, drafter or None, note or None) from CLI options, the defaults and the
    registry; the note says why there is no drafter."""
    defaults = _optional("defaults")
    if model is not None and defaults is not None:
        model = defaults.named_target(model)
    if model is None:
        if defaults is None:
            raise ValueError(
                "No built-in default model yet: pass --model <folder or Hub id> "
                "(and --draft <drafter> for speculative decoding)."
            )
        model = defaults.default_target()
        if draft is None and not no_draft:
            draft = defaults.default_draft()
    if no_draft:
        return model, None, "plain decoding (--no-draft)"
    if draft is None:
        registry = _optional("registry")
        draft = registry.drafter_for(model) if registry is not None else None
        if draft is None:
            return model, None, "no drafter: plain decoding; pass --draft"
    return model, draft, None


def context_length(model) -> int | None:
    """The target's context window from its config, when it declares one."""
    args = getattr(model, "args", None)
    for src in (args, getattr(args, "text_config", None)):
        if isinstance(src, dict):
            value = src.get("max_position_embeddings")
        else:
            value = getattr(src, "max_position_embeddings", None)
        if value:
            return int(value)
    return None
