"""The drafter's output head: the target's LM head, optionally cut to a draft
vocabulary.

A drafter may carry `draft_vocab`, a sorted list of token ids (EAGLE-3 calls this a
draft
vocabulary). It then scores only those rows of the target's head: on a 49K-token target
with a 4K draft vocabulary the drafter's head costs 12× less at inference and in
training.
Output stays lossless: a token outside the draft vocabulary is never proposed (its draft
probability is 0), which the verifier's greedy and rejection rules already handle.

The ids ship beside the weights in `draft_vocab.json`, not inside `model.safetensors`:
other runtimes (the reference `dflash`) load every tensor of a drafter's safetensors
strictly, and ignore the extra JSON file (they then score the whole vocabulary).
"""

import json
from collections import Counter
from collections.abc import Iterable
from functools import cached_property
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import numpy as np


class DraftHead:
    """Head logits for drafted positions, and the way back to target token ids."""

    def __init__(
        self, target, vocab: mx.array | None = None, raw: bool = False, kernels=None
    ):
        self.target = target
        # the target's, or (training) MLX's own: the native products have no gradient
        self.kernels = kernels or target.kernels
        self.vocab = vocab
        self.vocab_size = target.vocab_size
        self.rows = None if vocab is None else _as_linear(head_rows(target, vocab))
        self.raw = raw  # leave out the target's multiplier and soft-cap

    @classmethod
    def for_drafter(cls, target, draft, kernels=None) -> "DraftHead":
        """The head for `draft`: a drafter that sets its own output multiplier or
        soft-cap gets the bare head (it applies its own), others the target's."""
        args = draft.args
        raw = args.output_multiplier != 1.0 or bool(args.final_logit_softcapping)
        return cls(target, getattr(draft, "draft_vocab", None), raw, kernels)

    def __call__(self, hidden: mx.array) -> mx.array:
        """Logits over the draft vocabulary (the whole target vocabulary without
        one)."""
        if self.rows is None:
            logits = self.target.head(hidden, self.kernels)
        else:
            logits = self.kernels.linear(self.rows, hidden)
        return logits if self.raw else self.target.softcapped(logits)

    @cached_property
    def index(self) -> np.ndarray | None:
        """Target id → draft index (−1 outside), for training labels; None without a
        vocab."""
        if self.vocab is None:
            return None
        table = np.full(self.vocab_size, -1, dtype=np.int64)
        table[np.array(self.vocab.tolist())] = np.arange(self.vocab.size)
        return table

    def to_target(self, tokens: mx.array, q: mx.array | None):
        """Proposals and their distribution (L, V_draft) as target ids and (L, V)
        rows."""
        if self.vocab is None:
            return tokens, q
        tokens = self.vocab[tokens]
        if q is not None:
            index = mx.broadcast_to(self.vocab, q.shape)
            q = mx.put_along_axis(
                mx.zeros((q.shape[0], self.vocab_size), q.dtype), index, q, axis=-1
            )
        return tokens, q


def _as_linear(weight: mx.array) -> nn.Linear:
    """A bias-free linear layer over `weight`, so the device's kernels apply to it."""
    layer = nn.Linear(weight.shape[1], weight.shape[0], bias=False)
    layer.weight = weight  # replaces the random init before it is ever evaluated
    return layer


def head_rows(target, ids: mx.array) -> mx.array:
    """Rows `ids` of the target's LM head (or tied embedding) as a dense weight."""
    head = getattr(target.lm, "lm_head", None) or target.embed_tokens
    if "bias" in head:
        raise ValueError(
            "A draft vocabulary needs a bias-free LM head; train without --draft-vocab."
        )
    w = head.weight[ids]
    if "scales" in head:
        biases = head.biases[ids] if "biases" in head else None
        w = mx.dequantize(
            w,
            head.scales[ids],
            biases,
            group_size=head.group_size,
            bits=head.bits,
            mode=getattr(head, "mode", "affine"),
        )
    return w.astype(target.dtype)


def select_draft_vocab(responses: Iterable, prompts: Iterable, size: int) -> list[int]:
    """The `size` ids the drafter will be able to propose, sorted.

    Ranked by frequency in the target's responses (what it will be asked to predict),
    then
    topped up from the prompts (names and numbers the answers copy).
    """
    if size < 1:
        raise ValueError(f"--draft-vocab must be positive, got {size}.")
    said: Counter[int] = Counter()
    seen: Counter[int] = Counter()
    for r in responses:
        said.update(r)
    for p in prompts:
        seen.update(p)
    chosen = [t for t, _ in said.most_common(size)]
    if len(chosen) < size:
        have = set(chosen)
        chosen += [t for t, _ in seen.most_common() if t not in have][
            : size - len(chosen)
        ]
    return sorted(chosen)


DRAFT_VOCAB_FILE = "draft_vocab.json"


def write_draft_vocab(folder: Path, ids: Iterable[int]) -> Path:
    """Write the draft vocabulary beside a drafter's weights (atomically)."""
    from ..files import write_text

    ids = [int(i) for i in ids]
    return write_text(Path(folder) / DRAFT_VOCAB_FILE, json.dumps({"token_ids": ids}))


def read_draft_vocab(folder: Path, size: int, what: str) -> mx.array:
    """The `size` ids of `folder`'s draft_vocab.json, or a ValueError saying what is
    wrong with it."""
    file = Path(folder) / DRAFT_VOCAB_FILE
    fix = (
        f"its config says draft_vocab_size {size}: copy {DRAFT_VOCAB_FILE} from where "
        "the drafter was trained, or download the drafter again"
    )
    if not file.is_file():
        raise ValueError(f"{what} has no {DRAFT_VOCAB_FILE} ({fix}).")
    try:
        ids = json.loads(file.read_text())["token_ids"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{what}: '{file}' cannot be read ({e}); {fix}.") from e
    if (
        not isinstance(ids, list)
        or len(ids) != size
        or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids)
    ):
        raise ValueError(
            f"{what}: '{file}' must list {size} token ids under \"token_ids\"; {fix}."
        )
    return mx.array(ids, dtype=mx.int32)
