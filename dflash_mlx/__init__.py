"""DFlash speculative decoding on MLX: a block-diffusion drafter plus lossless
verification.

Exports load lazily so that `import dflash_mlx.files` or `dflash-mlx --help` stay fast.

The library, by role; each layer imports only the layers before it, and nothing imports
upward (tests/test_architecture.py checks it):
- base modules: `validate`, `files`, `sampling`, `kernels` (the kernels' interface),
  `distributed`, `conversation`, `datasets`, `install` (what else writes `dflash_mlx/`);
- `cpu/`: what MLX's CPU backend needs (never imported on a Mac);
- `backend`: `for_device`, the one entry point that picks kernels;
- `models/`: the drafters and the target side;
- `engine/`: the block loop in token ids and what steers it;
- `loading/` (names -> models) and `gguf/`;
- `generate`: the text API;
- `chat/`, `bench/`, `serve/`, `train/`: the library halves of the commands;
- then `cli/`, the commands.
"""

import sys
from importlib import import_module
from types import ModuleType

# The one place the version is written: pyproject.toml reads it (setuptools' `attr:`).
__version__ = "0.1.0"


def _warn_if_shadowed():
    """Warn once (at import) when another distribution writes `dflash_mlx/` here too;
    the CLI reports it as an error instead (cli/main.py)."""
    from .install import shadowing

    message = shadowing()
    program = (getattr(sys, "argv", None) or [""])[0]
    if message and not program.endswith("dflash-mlx"):
        import warnings

        warnings.warn(message, UserWarning, stacklevel=2)


_warn_if_shadowed()

_EXPORTS = {
    "DFlashConfig": ("models.draft", "ModelArgs"),
    "DFlashDraftModel": ("models.draft", "Model"),
    "GenerationResponse": ("generate", "GenerationResponse"),
    "PromptCache": ("models.cache", "PromptCache"),
    "SamplingParams": ("sampling", "SamplingParams"),
    "Target": ("models.target", "Target"),
    "check_compatible": ("loading.drafters", "check_compatible"),
    "generate": ("generate", "generate"),
    "load": ("loading.targets", "load"),
    "load_draft": ("loading.drafters", "load_draft"),
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
