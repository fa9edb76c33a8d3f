"""Train a DFlash drafter for a supported target: `dflash-mlx train` as a library.

May import anything of the library below the commands (the text API, loading, gguf,
models, base modules); never bench/, chat/, serve/ or cli/.
"""

from .blocks import (
    default_gamma,
    make_blocks,
    packed_mask,
    position_weights,
    sample_anchors,
)
from .data import load_prompts, read_samples, regenerate
from .export import export_drafter, new_drafter, new_drafter_args
from .features import FeatureStore, choose_mode
from .loop import SaveEvent, StepEvent, TrainConfig, Trainer, ValEvent, measure_tau
from .packed import block_logits, block_loss, packed_hidden
from .pipeline import Finished, Stage, TrainOptions, check, run

__all__ = [
    "FeatureStore",
    "Finished",
    "SaveEvent",
    "Stage",
    "StepEvent",
    "TrainConfig",
    "TrainOptions",
    "Trainer",
    "ValEvent",
    "block_logits",
    "check",
    "block_loss",
    "choose_mode",
    "default_gamma",
    "export_drafter",
    "load_prompts",
    "make_blocks",
    "measure_tau",
    "new_drafter",
    "new_drafter_args",
    "packed_hidden",
    "packed_mask",
    "position_weights",
    "read_samples",
    "regenerate",
    "run",
    "sample_anchors",
]
