"""The target side: one forward that yields the final hidden states AND the fused layer
features the drafter needs, plus exact rollback of the target cache after a partly
rejected block.

The forward is mlx-lm's own: the model's inner `__call__` (embedding, mask helpers,
layer loop, KV sharing, pipeline hand-offs, final norm) runs on a *view* of the model, a
shallow copy whose `layers` list holds stand-ins that call the real layers and keep the
outputs the drafter reads. GatedDeltaNet mixers (Qwen3.5/3.6, Qwen3-Next) get a stand-in
too: during a verify it keeps the mixer's input projections, and a rollback re-runs the
mixer's own code on the accepted prefix from the pre-block state with those projections
replayed, which costs only the conv and the recurrence. Nothing of the user's model is
modified: no class is patched and the model instance is untouched.

mlx-lm internals this relies on (pinned in pyproject.toml, checked on every family by
tests/test_target.py and tests/test_families.py):
- `<model>.language_model?.model` holds `embed_tokens`, `layers`, `norm`, and its
  `__call__(inputs, cache=...)` iterates `self.layers` (or `pipeline_layers`) with one
  cache per layer and returns the final-normed hidden states;
- the head: `lm_head` (gathered over `sharding_group` when sharded) or the tied
  embedding's `as_linear`, then `final_logit_softcapping` where the model has it
  (Muse Glimmer: `args.output_multiplier`, then `args.final_logit_softcapping`);
- GatedDeltaNet mixers compute everything from children named `in_proj*` and keep
  `[conv state, recurrent state]` in an `ArraysCache`; attention caches are trimmable.
The stand-ins are in taps.py. On the CPU, llama/qwen2/qwen3 blocks run through
`cpu/blocks.py` (cheaper kernels), and qwen3_5 mixers through `cpu/delta.py` (the
recurrence over a block in closed form), both reached through the kernels' fields.
"""

from typing import Any, cast

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.cache import (
    ArraysCache,
    KVCache,
    QuantizedKVCache,
    RotatingKVCache,
    make_prompt_cache,
)

from .. import validate
from ..backend import for_device
from ..kernels import Kernels
from .sliding_cache import SlidingKVCache
from .taps import DeltaTap, KernelNorm, LayerTap, Recording, view

SUPPORTED_MODEL_TYPES = (
    "llama",
    "qwen2",
    "qwen3",
    "qwen3_moe",
    "qwen3_5",
    "qwen3_5_moe",
    "qwen3_next",
    "gemma3_text",
    "gemma4",
    "gemma4_text",
    "gpt_oss",
    "deepseek_v3",
    "kimi_k25",
    "minimax",
    "muse_glimmer",
    "glm_moe_dsa",
)


def _text_parts(model: nn.Module):
    """(language model with the head, inner model with embed_tokens/layers/norm)."""
    lm = getattr(model, "language_model", model)
    inner = getattr(lm, "model", None)
    if inner is None or not all(
        hasattr(inner, a) for a in ("layers", "embed_tokens", "norm")
    ):
        raise ValueError(
            f"Unsupported target {type(model).__module__}: expected an mlx-lm text "
            "model with model.embed_tokens/layers/norm. Supported: "
            f"{', '.join(SUPPORTED_MODEL_TYPES)}."
        )
    return lm, inner


def model_type(model: nn.Module) -> str:
    args = getattr(model, "args", None)
    return (
        getattr(args, "model_type", None) or type(model).__module__.rsplit(".", 1)[-1]
    )


def _group(model: nn.Module, inner: nn.Module):
    """The distributed.Group a sharded target runs in, or None."""
    from ..distributed import Group, backend_name, model_group

    group = model_group(model)
    if group is None:
        return None
    sharding = "pipeline" if getattr(inner, "pipeline_size", 1) > 1 else "tensor"
    return Group(group, backend_name(), sharding)


def _config_layers(model: nn.Module) -> int:
    args: Any = getattr(model, "args", None)
    args = getattr(args, "text_config", None) or args
    if isinstance(args, dict):
        return int(args["num_hidden_layers"])
    return int(args.num_hidden_layers)


def _mixer(layer) -> nn.Module | None:
    """The layer's GatedDeltaNet mixer, if it is a linear-attention layer."""
    if layer is None or not getattr(layer, "is_linear", False):
        return None
    return getattr(layer, "linear_attn", None)


def _rollable(cache) -> bool:
    if isinstance(cache, ArraysCache):
        return True
    return cache is None or bool(getattr(cache, "is_trimmable", lambda: False)())


def _kv_sources(inner: nn.Module) -> set[int]:
    """Layers whose keys and values later layers read (Gemma 4's KV sharing). A
    sharing layer gets them with no cache of its own, so mlx-lm's attention there
    cannot take quantized ones: these layers' caches stay float."""
    previous = getattr(inner, "previous_kvs", None) or []
    return {p for i, p in enumerate(previous) if p != i}


def _head_transform(lm: nn.Module) -> tuple[float, float | None]:
    """(multiplier, soft-cap) that the model applies to its head's output, in that
    order: Gemma keeps the cap on the model, Muse Glimmer both in its args."""
    cap = getattr(lm, "final_logit_softcapping", None)
    if model_type(lm) != "muse_glimmer":
        return 1.0, cap
    args = lm.args
    return float(args.output_multiplier), args.final_logit_softcapping


def _embed_scale(inner: nn.Module, family: str) -> float:
    """The factor the model multiplies its embeddings by: Gemma 4 keeps it on the
    inner model, Gemma 3 computes sqrt(hidden) in bfloat16 inside its forward."""
    if family == "gemma3_text":
        root = inner.embed_tokens.weight.shape[1] ** 0.5
        return cast(float, mx.array(root, mx.bfloat16).item())
    return getattr(inner, "embed_scale", 1.0)


def _stand_in(layer, index: int, recording: Recording, block=None, delta=None):
    """The tap for one layer (`block`: a CPU block standing in for it; `delta`: the
    kernels' `delta_forward` for recurrent mixers)."""
    mixer = _mixer(layer)
    if mixer is not None:
        layer = view(layer, linear_attn=DeltaTap(mixer, recording, delta))
    return LayerTap(block or layer, index, recording)


class Target:
    """An mlx-lm model seen as a DFlash target."""

    def __init__(
        self,
        model: nn.Module,
        feature_layer_ids=(),
        kernels: Kernels | None = None,
    ):
        self.model = model
        self.model_type = model_type(model)
        if self.model_type not in SUPPORTED_MODEL_TYPES:
            raise ValueError(
                f"DFlash does not support '{self.model_type}' targets yet. "
                f"Supported: {', '.join(SUPPORTED_MODEL_TYPES)}."
            )
        self.lm, self.inner = _text_parts(model)
        self.layers = list(self.inner.layers)
        self.group = _group(model, self.inner)
        if self.group is not None and self.group.sharding == "pipeline":
            # a pipeline stage holds only its layers: the others are None or missing
            self.layers += [None] * (_config_layers(model) - len(self.layers))
        self.feature_layer_ids = tuple(int(i) for i in feature_layer_ids)
        bad = [i for i in self.feature_layer_ids if not 0 <= i < len(self.layers)]
        if bad:
            raise ValueError(
                f"Drafter reads target layers {list(self.feature_layer_ids)} but the "
                f"{self.model_type} target has {len(self.layers)} layers "
                f"(0..{len(self.layers) - 1}): use the drafter trained for this target."
            )
        self.kernels = kernels or for_device()
        self._recording = Recording(frozenset(self.feature_layer_ids))
        self._kv_checked: set[tuple[int, int]] = set()
        self._view = self._make_view()
        self._check_rollback()
        self.embed_tokens = self.inner.embed_tokens
        self.embed_scale = _embed_scale(self.inner, self.model_type)
        self.logit_scale, self.softcap = _head_transform(self.lm)

    def _make_view(self) -> nn.Module:
        kernels = self.kernels
        blocks = None
        if kernels.blocks is not None:  # the CPU's (cpu/blocks.py)
            layers = [la for la in self.layers if la]
            blocks = kernels.blocks(self.model_type, layers, kernels)
        self.cpu_blocks = blocks is not None  # standard blocks on the CPU's kernels
        pending = iter(blocks or ())
        taps = [
            layer
            and _stand_in(
                layer, i, self._recording, next(pending, None), kernels.delta_forward
            )
            for i, layer in enumerate(self.inner.layers)
        ]
        if not self.cpu_blocks:
            return view(self.inner, layers=taps)
        norm = KernelNorm(self.inner.norm, self.kernels)
        return view(self.inner, layers=taps, norm=norm)

    def _check_rollback(self):
        """Every cache must be trimmable or a GatedDeltaNet state we can replay."""
        deltas = sum(1 for la in self.layers if _mixer(la) is not None)
        caches = self.make_cache()
        states = sum(isinstance(c, ArraysCache) for c in caches)
        stuck = [type(c).__name__ for c in caches if not _rollable(c)]
        if stuck or states != deltas:
            kinds = ", ".join(sorted(set(stuck))) or "recurrent layers of a new kind"
            raise ValueError(
                f"The {self.model_type} target keeps state DFlash cannot roll back "
                f"({kinds}): speculative decoding needs a trimmable cache; decode it "
                "with mlx-lm."
            )
        self.recurrent = deltas > 0

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    @property
    def query_heads(self) -> int:
        """Attention heads of a query (the most of any layer)."""
        heads = [
            getattr(getattr(la, "self_attn", None), "n_heads", 0) for la in self.layers
        ]
        return max(heads + [1])

    @property
    def hidden_size(self) -> int:
        return self.inner.norm.weight.shape[0]

    @property
    def vocab_size(self) -> int:
        return self.embed_tokens.weight.shape[0]

    @property
    def dtype(self):
        return self.inner.norm.weight.dtype

    def make_cache(
        self,
        kv_bits: int | None = None,
        kv_group_size: int = 64,
        windows: bool = False,
    ) -> list[Any]:
        """Per-layer caches that can all be rolled back. mlx-lm's rotating caches of
        sliding-window layers become plain KV caches (the model's own masks keep the
        window; a prefix cache can cut them anywhere) or, with `windows`, bounded
        `SlidingKVCache`s whose cost stays flat as the context grows. With `kv_bits`,
        the attention layers' plain KV caches are mlx-lm's `QuantizedKVCache` from the
        first token on; sliding-window layers, recurrent states and the caches whose
        keys other layers share stay as they are."""
        kv = validate.kv_quantization(kv_bits, kv_group_size)
        if kv is not None and kv not in self._kv_checked:
            self._check_kv(kv)
        return self._caches(kv, windows)

    def _caches(self, kv: tuple[int, int] | None, windows: bool = False) -> list[Any]:
        cache = make_prompt_cache(self.model)  # one per local layer when pipelined
        shared = _kv_sources(self.inner) if kv is not None or windows else set()
        out = []
        for i, c in enumerate(cache):
            if isinstance(c, RotatingKVCache):
                bounded = windows and i not in shared and not c.keep
                c = SlidingKVCache(c.max_size) if bounded else KVCache()
            elif kv is not None and type(c) is KVCache and i not in shared:
                c = QuantizedKVCache(group_size=kv[1], bits=kv[0])
            out.append(c)
        return out

    def _check_kv(self, kv: tuple[int, int]):
        """A ValueError unless the attention runs on caches quantized as `kv`: one
        token through the layers, built lazily and never evaluated (MLX checks the
        shapes as it builds the graph), so it costs no compute."""
        if self.group is None:
            try:
                self(mx.array([[0]]), self._caches(kv))
            except (ValueError, TypeError) as e:
                bits, group = kv
                fix = (
                    "use a kv_group_size that divides its head size, or no kv_bits"
                    if "divisible" in str(e)
                    else "decode it without kv_bits"
                )
                raise ValueError(
                    f"The {self.model_type} target's attention cannot use a KV cache "
                    f"quantized to {bits} bits in groups of {group} "
                    f"({str(e).splitlines()[0]}): {fix}."
                ) from None
        self._kv_checked.add(kv)

    def embed(self, tokens: mx.array) -> mx.array:
        h = self.embed_tokens(tokens)
        return h * self.embed_scale if self.embed_scale != 1.0 else h

    def logits(self, hidden: mx.array) -> mx.array:
        """The target's LM head on final-normed hidden states."""
        return self.softcapped(self.head(hidden))

    def head(self, hidden: mx.array, kernels: Kernels | None = None) -> mx.array:
        """The LM head's own output, before the family's multiplier and soft-cap
        (on `kernels`, default the target's)."""
        linear = (kernels or self.kernels).linear
        head = getattr(self.lm, "lm_head", None)
        if head is None:
            return linear(self.embed_tokens, hidden)
        logits = linear(head, hidden)
        group = getattr(self.lm, "sharding_group", None)
        if group is not None:  # a sharded head holds a slice of the vocabulary
            from mlx_lm.models.base import gather_last_axis

            logits = gather_last_axis(logits, group)
        return logits

    def softcapped(self, logits: mx.array) -> mx.array:
        """The target's own transform of its head's output: Muse Glimmer's output
        multiplier, then the final soft-capping (identity for most families)."""
        if self.logit_scale != 1.0:
            logits = logits * self.logit_scale
        if self.softcap:
            logits = mx.tanh(logits / self.softcap) * self.softcap
        return logits

    def __call__(self, tokens: mx.array, cache: list[Any], tape: list | None = None):
        """Run the model on `tokens` (1, L): (final-normed hidden, fused features).

        With a `tape`, recurrent layers append what `rollback` needs to it.
        """
        recording = self._recording
        recording.outputs, recording.tape = {}, tape
        try:
            hidden = self._view(tokens, cache=cache)
            features = self._features(recording.outputs, hidden)
        finally:
            recording.outputs, recording.tape = {}, None
        return hidden, features

    def _features(self, outputs: dict, hidden: mx.array) -> mx.array | None:
        if not self.feature_layer_ids:
            return None
        if self.group is None or self.group.sharding != "pipeline":
            return mx.concatenate([outputs[i] for i in self.feature_layer_ids], -1)
        # Each pipeline stage has the outputs of its own layers: sum the zero-padded
        # pieces over the stages so every rank gets them all. Stages run different
        # graphs, so MLX could order this all-sum and the stages' send/recv differently
        # on each rank (a deadlock): each collective is evaluated on its own, in order.
        mx.eval(hidden)
        zeros = mx.zeros_like(hidden)
        parts = [outputs.get(i, zeros) for i in self.feature_layer_ids]
        features = mx.distributed.all_sum(
            mx.concatenate(parts, -1), group=self.group.group
        )
        mx.eval(features)
        return features

    def rollback(self, cache: list[Any], tape: list, processed: int, keep: int):
        """Undo the last forward of `processed` tokens except its first `keep`."""
        drop = processed - keep
        if drop <= 0:
            return
        records = iter(tape)
        for c in cache:
            if isinstance(c, ArraysCache):
                record = next(records)
                record.tap.replay(record, c, keep)
            elif c is not None:
                c.trim(drop)

    def rollback_rows(self, cache: list[Any], tape: list, keeps: list[int]):
        """A batch's verify step (models/ragged.py): row b keeps the first keeps[b]
        tokens it verified."""
        records = iter(tape)
        for c in cache:
            if isinstance(c, ArraysCache):
                record = next(records)
                record.tap.replay_rows(record, c, keeps)
            elif c is not None:
                c.commit(keeps)
