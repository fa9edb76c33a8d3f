"""Checks of the engine's inputs, with fix-it messages: one place for every entry point.

`stream_generate` and `generate_blocks` call these before any work, and the CLI calls
the same functions on its options before loading a model, so Python users, the chat,
the server and the command line all get the same `ValueError`.
"""

import math
import numbers
import operator
from collections.abc import Sequence

SEED_MAX = 2**64 - 1  # MLX's random keys are uint64


def is_int(value) -> bool:
    """An integer (numpy's included), not a bool."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def max_tokens(value) -> int:
    """A positive int, or -1 for no limit."""
    if not is_int(value):
        raise ValueError(
            f"max_tokens must be an integer (-1 for no limit), got {value!r}."
        )
    if value == 0 or value < -1:
        raise ValueError(
            f"max_tokens must be positive, or -1 for no limit; got {value}."
        )
    return value


def seed(value) -> int | None:
    """None, or an int MLX can seed with (0 .. 2**64 - 1)."""
    if value is None:
        return None
    if not is_int(value):
        raise ValueError(f"seed must be an integer, got {value!r}.")
    if not 0 <= value <= SEED_MAX:
        raise ValueError(
            f"seed must be between 0 and 2**64 - 1, got {value}: pick a "
            "non-negative seed such as 0 or 42 (or none for a random one)."
        )
    return value


def logprobs(value, vocab_size: int) -> int:
    """How many top log-probabilities per token: 0 (none) .. the vocabulary size."""
    if not is_int(value):
        raise ValueError(f"logprobs must be an integer (0 for none), got {value!r}.")
    if not 0 <= value <= vocab_size:
        raise ValueError(
            f"logprobs must be between 0 (none) and the vocabulary size "
            f"{vocab_size}, got {value}."
        )
    return value


def prefill_step_size(value) -> int:
    if not is_int(value) or value < 1:
        raise ValueError(
            f"prefill_step_size must be a positive integer (default 2048), got "
            f"{value!r}."
        )
    return value


def finite(name: str, value) -> float:
    """`value` as a float, refusing NaN, infinities and non-numbers."""
    if isinstance(value, bool):
        raise ValueError(f"{name} must be a number, got {value!r}.")
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a number, got {value!r}.") from None
    if not math.isfinite(number):
        raise ValueError(f"{name} must be a finite number, got {value!r}.")
    return number


def text(value: str, what: str = "The prompt") -> str:
    """`value` if it can be encoded as UTF-8 (undecodable input bytes, read with
    Python's surrogateescape, cannot)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ValueError(
            f"{what} is not valid UTF-8 text (a stray byte at character "
            f"{e.start}): convert it to UTF-8, e.g. `iconv -f latin1 -t utf-8`."
        ) from None
    return value


def token_ids(prompt, vocab_size: int | None = None) -> list[int]:
    """Prompt ids as a list of ints: one 1-D sequence (or a (1, n) array) of
    integers, each inside the target's vocabulary when `vocab_size` is given."""
    ids = _flat_ids(prompt)
    if not ids:
        raise ValueError("The prompt is empty: give at least one token.")
    if vocab_size is not None:
        bad = next((t for t in ids if not 0 <= t < vocab_size), None)
        if bad is not None:
            raise ValueError(
                f"Prompt token id {bad} is outside the target's vocabulary "
                f"(0..{vocab_size - 1}): encode the prompt with this model's "
                "tokenizer."
            )
    return ids


def _flat_ids(prompt) -> list[int]:
    shape = getattr(prompt, "shape", None)
    if shape is not None:  # an mx.array or numpy array
        if len(shape) == 2 and shape[0] == 1:
            prompt = prompt[0]
        elif len(shape) != 1:
            raise ValueError(
                f"The prompt array has shape {tuple(shape)}: pass one prompt as a "
                "1-D array of token ids (generate one prompt at a time)."
            )
        kind = str(getattr(prompt, "dtype", "")).rsplit(".", 1)[-1]
        if "int" not in kind:
            raise ValueError(
                f"Prompt token ids must be integers, got an array of {kind}."
            )
        prompt = prompt.tolist()
    if not isinstance(prompt, Sequence):
        raise ValueError(
            f"The prompt must be text, a list of token ids or a 1-D array, got "
            f"{type(prompt).__name__}."
        )
    return [_one_id(t) for t in prompt]


def _one_id(token) -> int:
    if isinstance(token, bool):
        raise ValueError(f"Prompt token ids must be integers, got {token!r}.")
    try:
        return operator.index(token)
    except TypeError:
        raise ValueError(
            f"Prompt token ids must be integers, got {token!r} "
            f"({type(token).__name__}): pass a flat list of ints."
        ) from None


def block_size(value, largest: int | None) -> tuple[int, str | None]:
    """An int block size >= 1, capped at the drafter's `largest`; (size, note) where
    the note says why it was capped."""
    if not is_int(value) or value < 1:
        raise ValueError(
            f"block_size must be a positive integer or 'auto', got {value!r}."
        )
    if largest is not None and value > largest:
        note = (
            f"block size {value} is above the drafter's {largest}: using {largest} "
            "(larger blocks only add drafts it was not trained to make)."
        )
        return largest, note
    return value, None


KV_BITS = (2, 3, 4, 5, 6, 8)  # MLX's affine quantization widths
KV_GROUP_SIZES = (32, 64, 128)


def kv_quantization(bits, group_size) -> tuple[int, int] | None:
    """None (a float KV cache) or (bits, group size) MLX can quantize keys with."""
    if bits is None:
        return None
    if not is_int(bits) or bits not in KV_BITS:
        raise ValueError(
            f"kv_bits must be one of {', '.join(map(str, KV_BITS))} (or None for a "
            f"float KV cache), got {bits!r}."
        )
    if not is_int(group_size) or group_size not in KV_GROUP_SIZES:
        raise ValueError(
            f"kv_group_size must be one of "
            f"{', '.join(map(str, KV_GROUP_SIZES))}, got {group_size!r}."
        )
    return int(bits), int(group_size)
