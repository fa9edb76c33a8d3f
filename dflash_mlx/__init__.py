"""DFlash speculative decoding on MLX: a block-diffusion drafter plus lossless verification."""

from .cache import PromptCache
from .draft import Model as DFlashDraftModel
from .draft import ModelArgs as DFlashConfig
from .generate import GenerationResponse, generate, make_prompt_cache, stream_generate
from .loading import check_compatible, load, load_draft
from .target import Target
from .verify import SamplingParams

__version__ = "0.1.0"

__all__ = [
    "DFlashConfig",
    "DFlashDraftModel",
    "GenerationResponse",
    "PromptCache",
    "SamplingParams",
    "Target",
    "check_compatible",
    "generate",
    "load",
    "load_draft",
    "make_prompt_cache",
    "stream_generate",
]
