"""Names -> models, with fix-it errors: which models to load (`resolve`, the built-in
pair in `defaults`, the drafter `registry`), Hub downloads (`hub`), the registry
downloads of the built-in target (`builtin_target`) and of Gemma 3 270M
(`long_target`, `--model gemma3-270m`), loading targets
(`targets`) and drafters (`drafters`), and checking a target before any download
(`check`, for `dflash-mlx doctor`).

May import the base modules, `backend`, `models` and `gguf`; never the engine's text
API or anything above it.
"""

from .drafters import DRAFT_FILES, check_compatible, load_draft
from .targets import TARGET_FILES, check_safetensors, load, read_safetensors

__all__ = [
    "DRAFT_FILES",
    "TARGET_FILES",
    "check_compatible",
    "check_safetensors",
    "load",
    "load_draft",
    "read_safetensors",
]
