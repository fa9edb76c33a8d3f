"""DFlash speculative decoding on MLX: a block-diffusion drafter plus lossless
verification.

Exports load lazily so that `import dflash_mlx.blas` or `dflash-mlx --help` stay fast.
"""

import sys
from importlib import import_module
from types import ModuleType

__version__ = "0.1.0"

_EXPORTS = {
    "DFlashConfig": ("draft", "ModelArgs"),
    "DFlashDraftModel": ("draft", "Model"),
    "GenerationResponse": ("generate", "GenerationResponse"),
    "PromptCache": ("cache", "PromptCache"),
    "SamplingParams": ("verify", "SamplingParams"),
    "Target": ("target", "Target"),
    "check_compatible": ("loading", "check_compatible"),
    "generate": ("generate", "generate"),
    "load": ("loading", "load"),
    "load_draft": ("loading", "load_draft"),
    "make_prompt_cache": ("generate", "make_prompt_cache"),
    "stream_generate": ("generate", "stream_generate"),
}

__all__ = sorted(_EXPORTS)


class _Package(ModuleType):
    """`dflash_mlx.generate` is the function even once the submodule of the same name
    is imported (the import system then sets the attribute to the module)."""

    @property
    def generate(self):
        return import_module(".generate", __name__).generate

    @generate.setter
    def generate(self, value):
        pass  # the import system's binding of the submodule: sys.modules keeps it


sys.modules[__name__].__class__ = _Package


def __getattr__(name):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'dflash_mlx' has no attribute {name!r}")
    module, attr = _EXPORTS[name]
    return getattr(import_module(f".{module}", __name__), attr)


def __dir__():
    return sorted(list(globals()) + __all__)
