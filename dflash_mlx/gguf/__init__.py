"""GGUF targets: llama, qwen2, qwen3, qwen3moe, gpt-oss and gemma3 files as mlx-lm's own
models.

`file` reads a GGUF header and its tensors, `arch` maps an architecture's metadata to
an mlx-lm config, `tokenizer` builds the Hugging Face tokenizer the file describes
(`spm` its SentencePiece vocabularies), and
`load` (`load_gguf`) puts them together. May import the base modules only (nothing of
models, the engine or loading: `loading` calls it).
"""

from .arch import ARCHITECTURES, FIX_ARCH, REFUSED, check_architecture, model_config
from .load import load_gguf, unpermute_rows
from .tokenizer import build_tokenizer

__all__ = [
    "ARCHITECTURES",
    "FIX_ARCH",
    "REFUSED",
    "build_tokenizer",
    "check_architecture",
    "load_gguf",
    "model_config",
    "unpermute_rows",
]
