"""The engines a benchmark compares, each a callable `engine(prompt_ids, max_tokens,
block_size)` that yields `(tokens, accepted)` per step (`accepted` = acceptance length,
None for the prefill token), or `(tokens, accepted, step)` where it knows more:
`step` is `block_info`'s dict (what proposed the tokens, how many were proposed and
taken). Engines are injectable, so tests can pass a wrong one."""

from collections.abc import Callable, Iterable

import mlx.core as mx

# (prompt ids, max tokens, block size or "auto") -> (tokens, accepted) per step
Engine = Callable[[list[int], int, int | str], Iterable[tuple]]
BASELINE = "baseline"
PLAIN = "plain"  # this package's own plain decoding (what --no-draft runs)


def mlx_lm_engine(model, tokenizer, sampler, kv_bits=None, kv_group_size=64) -> Engine:
    """Plain decoding with mlx-lm's `stream_generate`: what users run without DFlash
    (`kv_bits`: its KV cache quantized from the first token, as ours)."""
    from mlx_lm import stream_generate as lm_stream_generate

    kv = {}
    if kv_bits is not None:
        kv = dict(kv_bits=kv_bits, kv_group_size=kv_group_size, quantized_kv_start=0)

    def run(ids, max_tokens, block_size):
        for r in lm_stream_generate(
            model, tokenizer, ids, max_tokens=max_tokens, sampler=sampler, **kv
        ):
            yield [r.token], None

    return run


def block_info(response) -> dict:
    """A response's proposals: `source` ("draft", "lookup", "splice"; None: none),
    `proposed` (tokens verified after the last committed one), `taken` (accepted)."""
    return dict(
        source=response.source,
        proposed=response.block_size - 1,
        taken=response.from_draft,
    )


def plain_engine(
    model,
    tokenizer,
    temperature=0.0,
    top_p=1.0,
    top_k=0,
    kv_bits=None,
    kv_group_size=64,
) -> Engine:
    """This package's `stream_generate` without a drafter or lookup: the decoding that
    DFlash's own gains are measured against (`generate --no-draft`)."""
    from ..generate import stream_generate

    def run(ids, max_tokens, block_size):
        for r in stream_generate(
            model, None, tokenizer, ids, max_tokens=max_tokens,
            temperature=temperature, top_p=top_p, top_k=top_k, lookup=False,
            kv_bits=kv_bits, kv_group_size=kv_group_size,
        ):  # fmt: skip
            yield r.tokens, r.accepted, block_info(r)

    return run


def dflash_engine(
    model,
    draft,
    tokenizer,
    temperature=0.0,
    top_p=1.0,
    top_k=0,
    lookup=None,
    kv_bits=None,
    kv_group_size=64,
) -> Engine:
    """This package's `stream_generate` (`lookup`: its prompt lookup setting)."""
    from ..engine.policy import AdaptiveBlockSize
    from ..generate import stream_generate
    from ..models.target import Target

    target = Target(model, draft.args.target_layer_ids)
    auto = AdaptiveBlockSize.for_drafter(draft)  # learns across prompts, as a chat

    def run(ids, max_tokens, block_size):
        policy = auto if block_size == "auto" else block_size
        for r in stream_generate(
            target,
            draft,
            tokenizer,
            ids,
            block_size=policy,
            max_tokens=max_tokens,
            temperature=temperature,
            top_p=top_p,
            top_k=top_k,
            lookup=lookup,
            kv_bits=kv_bits,
            kv_group_size=kv_group_size,
        ):
            yield r.tokens, r.accepted, block_info(r)

    return run


def reference_config(args):
    """The reference package's `DFlashConfig` for our drafter `ModelArgs`."""
    import dataclasses

    from dflash import model_mlx as ref

    values = {
        f.name: getattr(args, f.name)
        for f in dataclasses.fields(ref.DFlashConfig)
        if hasattr(args, f.name)
    }
    values.update(
        target_layer_ids=tuple(args.target_layer_ids),
        layer_types=tuple(args.layer_types),
    )
    return ref.DFlashConfig(**values)


def _reference_drafter(ref, draft_dir):
    """Our drafter folder loaded into the reference's drafter class."""
    import json
    from pathlib import Path

    from ..loading import read_safetensors
    from ..models.draft import ModelArgs

    args = ModelArgs.from_config(
        json.loads((Path(draft_dir) / "config.json").read_text())
    )
    v2 = args.architecture == "DFlash2DraftModel"
    draft = (ref.DFlash2DraftModel if v2 else ref.DFlashDraftModel)(
        reference_config(args)
    )
    weights = {
        k: v
        for f in sorted(Path(draft_dir).glob("*.safetensors"))
        for k, v in read_safetensors(f).items()
    }
    for key in (
        "candidate_selector.predecessor_codebook",
        "candidate_selector.successor_codebook",
    ):
        if key in weights:  # the reference keeps these as Embedding layers
            weights[f"{key}.weight"] = weights.pop(key)
    draft.load_weights(list(weights.items()))
    draft.eval()
    mx.eval(draft.parameters())
    return draft


def reference_engine(
    target_dir, draft_dir, temperature=0.0, top_p=1.0, top_k=0
) -> Engine:
    """The reference `dflash.model_mlx` engine on its own copy of the target (it wraps
    layers)."""
    try:
        from dflash import model_mlx as ref
    except ImportError as e:
        raise ValueError(
            "--engine reference needs the reference package: "
            "pip install --no-deps dflash==0.1.0"
        ) from e

    model, tokenizer = ref.load(str(target_dir))
    draft = _reference_drafter(ref, draft_dir)

    def run(ids, max_tokens, block_size):
        for r in ref.stream_generate(
            model,
            draft,
            tokenizer,
            ids,
            block_size=block_size,
            max_tokens=max_tokens,
            temperature=temperature,
            top_p=top_p,
            top_k=top_k,
        ):
            yield r.tokens, r.accepted

    return run
