"""`dflash-mlx train` as a library call: data → features → training → export.

Every stage is resumable: run the same command again after an interruption and it
skips cached responses and features and continues from the newest checkpoint.
Layout of the output folder:

    OUT/config.json, model.safetensors, README.md   the drafter (z-lab format)
    OUT/draft_vocab.json, acceptance.json           its extras (other runtimes ignore)
    OUT/data/responses.jsonl, meta.json             regenerated responses (token ids)
    OUT/features/layers-…/shard-*.safetensors       cached target features (if cached)
    OUT/checkpoints/step-*/                         weights + optimizer + counters
"""

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import mlx.core as mx
import numpy as np

from ..models.draft_head import select_draft_vocab
from . import corpus
from .checks import check_init_from, check_options, check_out
from .data import (
    check_meta,
    encode_chat,
    load_prompts,
    read_samples,
    regenerate,
    samples_for_training,
    split_prompts,
)
from .export import (
    DEFAULT_BLOCK_SIZE,
    DEFAULT_DRAFT_LAYERS,
    export_drafter,
    init_weights,
    new_drafter,
    new_drafter_args,
)
from .features import FeatureStore, choose_mode
from .loop import TrainConfig, Trainer


@dataclass
class TrainOptions:
    target: str
    out: Path
    prompts: list = field(default_factory=lambda: ["bundled:gsm8k-train"])
    max_prompts: int = 0  # 0 = all
    val_prompts: int = 16
    draft_layers: int = DEFAULT_DRAFT_LAYERS
    block_size: int = DEFAULT_BLOCK_SIZE
    target_layer_ids: list | None = None
    mask_token_id: int | None = None
    sliding_window: int = 0  # 0: full attention; W: every draft layer sees W positions
    max_new_tokens: int = 256
    max_len: int = 3072
    gen_batch_size: int = 32
    temperature: float = 0.0
    features: str = "auto"  # auto | cache | fly
    feature_budget_gb: float = 20.0
    draft_vocab: int = 0  # 0: the whole target vocabulary; N: the N most used tokens
    init_from: Path | None = None  # start from these drafter weights (not a resume)
    corpus: Path | None = None  # responses kept across runs (see corpus.py)
    generate: bool = True  # False: train only on responses already stored
    train: TrainConfig = field(default_factory=TrainConfig)
    force: bool = False  # write into an --out folder that holds another model

    def __post_init__(self):
        check_options(self)


@dataclass
class Stage:
    name: str  # "data" | "features" | "train" | "export"
    detail: str = ""


@dataclass
class Finished:
    path: Path
    steps: int
    tau: float | None
    samples: int
    train_seconds: float


def prompt_sets(specs: list, val_prompts: int, seed: int = 0) -> tuple[list, list]:
    """(training, held-out) prompts of `specs`, shuffled by `seed`: the split `train`
    makes, so the held-out ones can be measured again later (never trained on)."""
    prompts = [p for spec in specs for p in load_prompts(spec)]
    if not prompts:
        raise ValueError(
            "The prompt sets are empty: pass --prompts with at least one prompt."
        )
    order = np.random.default_rng(seed).permutation(len(prompts))
    return split_prompts([prompts[i] for i in order], val_prompts)


def _prompt_sets(opts: TrainOptions):
    train, val = prompt_sets(opts.prompts, opts.val_prompts, opts.train.seed)
    if opts.max_prompts > 0:
        train = train[: opts.max_prompts]
    return train, val


def _truncate(samples, max_len: int):
    for s in samples:
        s.response = s.response[: max(0, max_len - len(s.prompt))]
    return samples


def load_target(spec: str):
    """A folder / Hub id through `dflash_mlx.load`; a .gguf file in float (exact
    weights, fast plain matmuls for the many forwards of data generation and
    features)."""
    if str(spec).endswith(".gguf"):
        from ..gguf import load_gguf

        return load_gguf(str(spec))
    from ..loading import load

    return load(str(spec))


def check(opts: TrainOptions) -> tuple[list, list]:
    """Everything checkable before the target loads (the output folder, the prompt
    sets, --init-from); the (train, validation) prompts."""
    check_out(opts.out, opts.force)
    check_init_from(opts.init_from)
    return _prompt_sets(opts)


def _responses(opts: TrainOptions, model, tokenizer, prompts: list, data: Path):
    """The data stage: responses from the corpus, then the target for the rest (unless
    `generate` is off); the corpus gets every new one. Returns the prompts to train
    on."""
    cache = data / "responses.jsonl"
    meta = corpus.corpus_meta(opts.target, opts.temperature, opts.max_new_tokens)
    if opts.corpus is not None:  # responses earlier runs already made
        corpus.seed_cache(opts.corpus, meta, prompts, tokenizer, cache)
    if not opts.generate:
        have = {s.id for s in read_samples(cache)}
        prompts = [p for p in prompts if p.id in have]
        if not prompts:
            raise ValueError(
                "--no-generate found no stored response for these prompts: pass the "
                "--corpus that holds them, or let the target generate them."
            )
    try:
        yield from regenerate(
            model,
            tokenizer,
            prompts,
            cache,
            opts.max_new_tokens,
            opts.max_len,
            opts.gen_batch_size,
            opts.temperature,
            opts.train.seed,
        )
    finally:  # also after Ctrl-C: what was generated joins the corpus
        if opts.corpus is not None and opts.generate:
            corpus.write_corpus(opts.corpus, meta, cache)
    return prompts


def run(opts: TrainOptions, model=None, tokenizer=None) -> Iterator:
    """Yield Stage, DataProgress, FeatureProgress, Step/Val/SaveEvent, then Finished."""
    from ..models.target import Target

    out = Path(opts.out).expanduser()
    train_prompts, val_prompts = check(opts)
    if model is None:
        model, tokenizer = load_target(opts.target)
    args = _drafter_args(opts, Target(model))
    samples = yield from _data(opts, model, tokenizer, train_prompts, out / "data")
    target = Target(model, args.target_layer_ids)
    store = yield from _features(opts, target, samples, out / "features")
    draft, grown = _drafter(opts, args, samples)
    val_ids = [encode_chat(tokenizer, p.messages) for p in val_prompts]
    trainer = Trainer(
        target, draft, tokenizer, samples, store, opts.train, out, val_ids
    )
    start = trainer.resume()
    yield Stage(
        "train",
        f"{len(samples)} samples, steps {start}→{trainer.total}, "
        f"{opts.draft_layers} layers, block {opts.block_size}, "
        f"target layers {args.target_layer_ids}"
        + (
            f"; new layers {grown} start as the identity" if grown and not start else ""
        ),
    )
    if start >= trainer.total:  # finished before: measure what the export ships
        ev = trainer.validate()
        if ev is not None:
            yield ev
    yield from trainer.run()

    tau = trainer.history.val[-1][1] if trainer.history.val else None
    yield Stage("export", str(out))
    card = _model_card(opts, trainer, len(samples), len(val_ids), tau)
    export_drafter(draft, out, card, dtype=target.dtype, acceptance=trainer.acceptance)
    yield Finished(out, trainer.step, tau, len(samples), trainer.history.train_seconds)


def _drafter_args(opts: TrainOptions, probe):
    """The new drafter's shape for this target; --init-from's weights are checked
    against it now, before hours of data and features."""
    args = new_drafter_args(
        probe,
        opts.draft_layers,
        opts.block_size,
        opts.target_layer_ids,
        opts.mask_token_id,
        opts.sliding_window,
    )
    if opts.init_from:
        init_weights(new_drafter(args, opts.train.seed), Path(opts.init_from))
    return args


def _data(opts: TrainOptions, model, tokenizer, prompts: list, data: Path):
    """The data stage; returns the samples to train on (truncated to --max-len)."""
    how = "greedy" if opts.temperature == 0 else f"temperature {opts.temperature}"
    yield Stage("data", f"{len(prompts)} prompts, responses by the target ({how})")
    check_meta(
        data / "meta.json",
        {
            "target": str(opts.target),
            "temperature": opts.temperature,
            "max_new_tokens": opts.max_new_tokens,
        },
    )
    prompts = yield from _responses(opts, model, tokenizer, prompts, data)
    samples = _truncate(read_samples(data / "responses.jsonl"), opts.max_len)
    return samples_for_training(samples, {p.id for p in prompts})


def _features(opts: TrainOptions, target, samples, folder: Path):
    """The features stage: cached on disk or computed on the fly; returns the store."""
    mode, why = choose_mode(
        opts.features, samples, target, folder, opts.feature_budget_gb
    )
    yield Stage("features", f"{mode}: {why}")
    store = FeatureStore(target, samples, mode, folder)
    yield from store.prepare()
    return store


def _drafter(opts: TrainOptions, args, samples):
    """The drafter to train (fresh or --init-from's weights, with its draft
    vocabulary chosen from these responses: the head is the target's, frozen, so
    a new vocabulary loses nothing trained) and the layers the donor lacked."""
    if opts.draft_vocab:
        vocab = select_draft_vocab(
            (s.response for s in samples), (s.prompt for s in samples), opts.draft_vocab
        )
        args.draft_vocab_size = len(vocab)
    draft, grown = new_drafter(args, opts.train.seed), []
    if opts.init_from:
        grown = init_weights(draft, Path(opts.init_from))
    if opts.draft_vocab:
        draft.draft_vocab = mx.array(vocab, dtype=mx.int32)
    return draft, grown


def _model_card(opts: TrainOptions, trainer, samples: int, val_prompts: int, tau):
    return {
        "target": str(opts.target),
        "data": ", ".join(opts.prompts),
        "samples": samples,
        "steps": trainer.step,
        "batch": opts.train.batch_size,
        "lr": opts.train.lr,
        "tau": tau,
        "val_prompts": val_prompts,
        "train_time": f"{trainer.history.train_seconds / 60:.1f} min of training",
    }
