"""The training loop: weighted block loss, AdamW + cosine schedule with warm-up,
gradient clipping and accumulation, checkpoints with exact resume, and validation τ
measured with the real engine. It yields events; it never prints (the CLI renders them).

Randomness is a pure function of (seed, micro-batch index): the sample order of an epoch
and the anchors of a sequence are re-derived on resume, so an interrupted run continues
exactly as if it had not stopped.
"""

import json
import shutil
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
import numpy as np
from mlx.utils import tree_flatten, tree_map, tree_unflatten

from ..kernels import MLX
from ..loading import read_safetensors
from ..models.acceptance import Acceptance
from ..models.draft_head import DraftHead
from .blocks import make_blocks, sample_anchors
from .data import Sample
from .export import save_weights
from .packed import block_loss, layer_masks


@dataclass
class TrainConfig:
    steps: int = 0  # optimizer steps; 0 = derive from epochs
    epochs: float = 6.0
    batch_size: int = 4  # sequences per optimizer step (gradient accumulation)
    anchors: int = 64  # blocks per sequence
    lr: float = 6e-4
    warmup: float = 0.04  # fraction of steps
    weight_decay: float = 0.01
    clip: float = 1.0
    gamma: float | None = None  # loss decay; None = the paper's for the block size
    seed: int = 0
    val_every: int = 250  # steps; 0 = only at the end
    val_max_tokens: int = 128
    save_every: int = 250
    keep_checkpoints: int = 2

    def __post_init__(self):
        from .checks import check_config

        check_config(self)

    def total_steps(self, n_samples: int) -> int:
        if self.steps > 0:
            return self.steps
        return max(1, int(np.ceil(self.epochs * n_samples / self.batch_size)))


@dataclass
class StepEvent:
    step: int
    total: int
    loss: float
    accuracy: float  # weighted top-1 agreement with the target on block positions
    lr: float
    grad_norm: float
    tokens_per_s: float  # supervised block positions per second
    elapsed: float
    eta: float  # seconds


@dataclass
class ValEvent:
    step: int
    tau: float
    prompts: int


@dataclass
class SaveEvent:
    step: int
    path: Path


def schedule(lr: float, total: int, warmup_frac: float):
    warmup = int(round(total * warmup_frac))
    cosine = optim.cosine_decay(lr, max(total - warmup, 1), end=lr * 0.01)
    if warmup == 0:
        return cosine
    return optim.join_schedules(
        [optim.linear_schedule(lr * 0.01, lr, warmup), cosine], [warmup]
    )


def measure_acceptance(
    target,
    draft,
    tokenizer,
    prompts: Iterable[Sequence[int]],
    block_size: int,
    max_tokens: int = 128,
    source: str = "",
) -> Acceptance:
    """Greedy answers to `prompts` at a fixed `block_size`, counted per position."""
    from ..generate import stream_generate

    acceptance = Acceptance(block_size, source=source)
    for ids in prompts:
        acceptance.prompts += 1
        for r in stream_generate(
            target,
            draft,
            tokenizer,
            list(ids),
            block_size=block_size,
            max_tokens=max_tokens,
        ):
            acceptance.add(r)
    return acceptance


def measure_tau(
    target,
    draft,
    tokenizer,
    prompts: Sequence[Sequence[int]],
    block_size: int,
    max_tokens: int = 128,
) -> float:
    """Mean acceptance length (tokens per verify step), greedy, the real engine."""
    return measure_acceptance(
        target, draft, tokenizer, prompts, block_size, max_tokens
    ).tau


@dataclass
class _History:
    val: list = field(default_factory=list)  # [(step, tau)]
    train_seconds: float = 0.0


class Trainer:
    """Trains `draft` against a frozen `target` (a `dflash_mlx.Target`) on `samples`."""

    def __init__(
        self,
        target,
        draft,
        tokenizer,
        samples: Sequence[Sample],
        features,
        config: TrainConfig,
        folder: Path,
        val_prompts: Sequence[Sequence[int]] = (),
    ):
        if not samples:
            raise ValueError(
                "No training samples with a response of 2+ tokens: generate data first."
            )
        self.target, self.draft, self.tokenizer = target, draft, tokenizer
        self.samples, self.features, self.config = list(samples), features, config
        self.folder = Path(folder)
        self.val_prompts = [list(p) for p in val_prompts]
        self.total = config.total_steps(len(self.samples))
        self.optimizer = optim.AdamW(
            learning_rate=schedule(config.lr, self.total, config.warmup),
            weight_decay=config.weight_decay,
        )
        self.history = _History()
        # the last validation's per-position counts: exported as the policy's prior
        self.acceptance: Acceptance | None = None
        # a drafter from load_draft is in eval mode (the CPU's kernels, no gradients)
        draft.train()
        self.optimizer.init(draft.trainable_parameters())
        self._grad = nn.value_and_grad(draft, self._loss)
        self.head = DraftHead.for_drafter(target, draft, MLX)  # gradients flow

    @property
    def step(self) -> int:
        s = self.optimizer.state.get("step")
        return int(s.item()) if s is not None else 0

    # -- one step ----------------------------------------------------------------------

    def _loss(self, features, blocks, masks):
        loss, wsum, correct = block_loss(
            self.target, self.draft, features, blocks, masks, self.head
        )
        return loss, (wsum, correct)

    def micro_batch(self, m: int) -> tuple[Sample, np.ndarray]:
        """The sample and anchors of global micro-batch `m` (a function of seed, m)."""
        n = len(self.samples)
        order = np.random.default_rng([self.config.seed, m // n]).permutation(n)
        s = self.samples[order[m % n]]
        rng = np.random.default_rng([self.config.seed, 1, m])
        return s, sample_anchors(rng, len(s.prompt), len(s.tokens), self.config.anchors)

    def train_step(self) -> dict:
        """One optimizer step over `batch_size` sequences; returns its metrics."""
        cfg, B = self.config, self.draft.args.block_size
        grads, losses, wsum, correct, used = None, [], 0.0, 0.0, 0
        for j in range(cfg.batch_size):
            sample, anchors = self.micro_batch(self.step * cfg.batch_size + j)
            if len(anchors) == 0:
                continue
            blocks = make_blocks(
                sample.tokens, anchors, B, self.draft.args.mask_token_id, cfg.gamma
            )
            context = int(anchors.max())
            feats = self.features.get(sample.id)[:, :context].astype(mx.float32)
            masks = layer_masks(self.draft, anchors, B, context)
            (loss, (w, c)), g = self._grad(feats, blocks, masks)
            grads = g if grads is None else tree_map(mx.add, grads, g)
            mx.eval(grads, loss, w, c)
            losses.append(loss.item())
            wsum, correct, used = (
                wsum + w.item(),
                correct + c.item(),
                used + int((blocks.weights > 0).sum()),
            )
        if grads is None:
            raise ValueError(
                "A whole batch had no anchors: responses are too short to train on."
            )
        grads = tree_map(lambda g: g / len(losses), grads)
        grads, norm = optim.clip_grad_norm(grads, cfg.clip)
        lr = self.optimizer.learning_rate.item()
        self.optimizer.update(self.draft, grads)
        mx.eval(self.draft.parameters(), self.optimizer.state, norm)
        return dict(
            loss=float(np.mean(losses)),
            accuracy=correct / max(wsum, 1e-9),
            lr=lr,
            grad_norm=norm.item(),
            positions=used,
        )

    # -- the run -----------------------------------------------------------------------

    def run(self) -> Iterator:
        """Train to the end, yielding StepEvent, ValEvent and SaveEvent."""
        cfg = self.config
        tic, done_here, seconds_here, positions = time.perf_counter(), 0, 0.0, 0
        while self.step < self.total:
            t0 = time.perf_counter()
            try:
                m = self.train_step()
            except KeyboardInterrupt:
                if self.step > 0:
                    self.save()  # a finished step is consistent: resume from it
                raise
            dt = time.perf_counter() - t0
            done_here, seconds_here = done_here + 1, seconds_here + dt
            self.history.train_seconds += dt
            positions += m["positions"]
            per_step = seconds_here / done_here
            yield StepEvent(
                self.step,
                self.total,
                m["loss"],
                m["accuracy"],
                m["lr"],
                m["grad_norm"],
                positions / max(seconds_here, 1e-9),
                time.perf_counter() - tic,
                per_step * (self.total - self.step),
            )
            last = self.step >= self.total
            if (cfg.val_every and self.step % cfg.val_every == 0) or last:
                ev = self.validate()
                if ev is not None:
                    yield ev
            if (cfg.save_every and self.step % cfg.save_every == 0) or last:
                yield SaveEvent(self.step, self.save())

    def validate(self) -> ValEvent | None:
        if not self.val_prompts:
            return None
        self.acceptance = measure_acceptance(
            self.target,
            self.draft,
            self.tokenizer,
            self.val_prompts,
            self.draft.args.block_size,
            self.config.val_max_tokens,
            source=f"{len(self.val_prompts)} held-out training prompts, greedy",
        )
        tau = self.acceptance.tau
        self.history.val.append((self.step, tau))
        return ValEvent(self.step, tau, len(self.val_prompts))

    # -- checkpoints -------------------------------------------------------------------

    @property
    def checkpoint_dir(self) -> Path:
        return self.folder / "checkpoints"

    def save(self) -> Path:
        """Write weights, optimizer state and counters; keep the newest checkpoints."""
        step = self.step
        final = self.checkpoint_dir / f"step-{step:07d}"
        tmp = self.checkpoint_dir / f".step-{step:07d}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        save_weights(self.draft, tmp / "drafter.safetensors")
        mx.save_safetensors(
            str(tmp / "optimizer.safetensors"), dict(tree_flatten(self.optimizer.state))
        )
        state = {
            "step": step,
            "total": self.total,
            "config": asdict(self.config),
            "drafter": self.draft.args.to_config(),
            "val": self.history.val,
            "train_seconds": self.history.train_seconds,
        }
        (tmp / "state.json").write_text(json.dumps(state, indent=2))
        shutil.rmtree(final, ignore_errors=True)
        tmp.rename(final)
        for old in self.checkpoints()[: -self.config.keep_checkpoints]:
            shutil.rmtree(old, ignore_errors=True)
        return final

    def checkpoints(self) -> list[Path]:
        if not self.checkpoint_dir.exists():
            return []
        return sorted(p for p in self.checkpoint_dir.glob("step-*") if p.is_dir())

    def resume(self) -> int:
        """Continue from the newest checkpoint, if any; returns the step reached."""
        ckpts = self.checkpoints()
        if not ckpts:
            return 0
        path = ckpts[-1]
        state = json.loads((path / "state.json").read_text())
        if state["drafter"] != self.draft.args.to_config():
            raise ValueError(
                f"The checkpoint in {path} is for another drafter shape "
                "(--draft-layers/--block-size/target layers): use another --out, "
                "or the same options as before."
            )
        self.draft.load_weights(str(path / "drafter.safetensors"))
        self.optimizer.state = tree_unflatten(
            list(read_safetensors(path / "optimizer.safetensors").items())
        )
        self.history = _History(
            [tuple(v) for v in state.get("val", [])], state.get("train_seconds", 0.0)
        )
        mx.eval(self.draft.parameters(), self.optimizer.state)
        # the loaded vocabulary; MLX's kernels: gradients flow through the head
        self.head = DraftHead.for_drafter(self.target, self.draft, MLX)
        return self.step
