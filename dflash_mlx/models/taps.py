"""The stand-ins a `Target` puts in a view of the model: they call the real layers
and keep what the drafter reads (layer outputs) and what a rollback needs (a
GatedDeltaNet mixer's input projections and pre-block state). See target.py.
"""

import copy
from collections.abc import Callable
from dataclasses import dataclass, field

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.cache import ArraysCache

from ..kernels import Kernels


def view(module: nn.Module, **children) -> nn.Module:
    """A shallow copy of `module` with some children replaced; `module` is untouched."""
    copied = copy.copy(module)
    for name, child in children.items():
        copied[name] = child
    return copied


@dataclass
class Recording:
    """What the forward in progress keeps: the drafter's layer outputs, and (verify
    passes) a tape of what rolling back the recurrent layers needs."""

    wanted: frozenset = frozenset()
    outputs: dict = field(default_factory=dict)
    tape: list | None = None


class LayerTap:
    """Stands in for decoder layer `index` in a model view; keeps its output."""

    def __init__(self, layer, index: int, recording: Recording):
        self.layer, self.index, self.recording = layer, index, recording

    def __getattr__(self, name):  # the model's loop reads layer attributes
        return getattr(self.__dict__["layer"], name)

    def __call__(self, *args, **kwargs):
        out = self.layer(*args, **kwargs)
        if self.index in self.recording.wanted:
            self.recording.outputs[self.index] = (
                out[0] if isinstance(out, tuple) else out
            )
        return out


class KernelNorm:
    """Stands in for the model's final norm: the same layer on the device's
    kernels."""

    def __init__(self, norm: nn.Module, kernels: Kernels):
        self.norm, self.kernels = norm, kernels

    def __getattr__(self, name):
        return getattr(self.__dict__["norm"], name)

    def __call__(self, x):
        return self.kernels.norm(self.norm, x)


@dataclass
class DeltaRecord:
    """A GatedDeltaNet layer's verify pass: enough to redo it over a prefix."""

    tap: "DeltaTap"
    inputs: mx.array
    mask: mx.array | None
    state: tuple  # the ArraysCache state before the block
    projections: dict = field(default_factory=dict)  # in_proj* name -> output


class Projection:
    """An `in_proj*` child of a mixer view: records its output, or replays a prefix."""

    def __init__(self, name: str, module, tap: "DeltaTap"):
        self.name, self.module, self.tap = name, module, tap

    def __call__(self, x):
        replay = self.tap.replaying
        if replay is not None:
            record, rows, keep = replay
            out = record.projections[self.name]
            return (out if rows is None else out[rows])[:, :keep]
        out = self.module(x)
        if self.tap.record is not None:
            self.tap.record.projections[self.name] = out
        return out


class DeltaTap:
    """Stands in for a GatedDeltaNet mixer; runs mlx-lm's own mixer code on a view whose
    input projections are `Projection`s."""

    def __init__(
        self, mixer: nn.Module, recording: Recording, delta_forward: Callable | None
    ):
        self.recording = recording
        self.record: DeltaRecord | None = None
        self.replaying: tuple | None = None
        names = [n for n in mixer if n.startswith("in_proj")]
        self.mixer = view(mixer, **{n: Projection(n, mixer[n], self) for n in names})
        # on the CPU, qwen3_5's recurrence over many tokens in closed form
        # (`Kernels.delta_forward`)
        self.forward = delta_forward(self.mixer) if delta_forward else self.mixer

    def __call__(self, inputs, mask=None, cache=None):
        tape = self.recording.tape
        if tape is None or cache is None:
            return self.forward(inputs, mask, cache)
        self.record = DeltaRecord(self, inputs, mask, snapshot(cache))
        tape.append(self.record)
        try:
            return self.forward(inputs, mask, cache)
        finally:
            self.record = None

    def replay(self, record: DeltaRecord, cache, keep: int):
        """Restore the pre-block state, then advance it over the first `keep` tokens."""
        cache.state = (list(record.state[0]), *record.state[1:])
        if keep == 0:
            return
        mask = None if record.mask is None else record.mask[:, :keep]
        self.replaying = (record, None, keep)
        try:  # only the cache updates are evaluated: the output projection is skipped
            self.forward(record.inputs[:, :keep], mask, cache)
        finally:
            self.replaying = None

    def replay_rows(self, record: DeltaRecord, cache: ArraysCache, keeps: list[int]):
        """A batch's rollback: row b's state advanced over its first keeps[b] tokens.

        Rows that keep the same count are replayed together, each exactly as `replay`
        would replay it alone (same code, same count): rows that kept the whole block
        already hold their state."""
        tokens = record.inputs.shape[1]
        groups: dict[int, list[int]] = {}
        for row, keep in enumerate(keeps):
            if keep < tokens:
                groups.setdefault(keep, []).append(row)
        if not groups:
            return
        states = list(cache.cache)
        before = record.state[0]
        for keep, rows in groups.items():
            index = mx.array(rows)
            part = ArraysCache(len(before))
            part.cache = [None if a is None else a[index] for a in before]
            if keep > 0:
                self.replaying = (record, index, keep)
                try:
                    self.forward(record.inputs[index, :keep], None, part)
                finally:
                    self.replaying = None
            for i, a in enumerate(part.cache):
                if a is not None:
                    states[i][index] = a
        cache.cache = states


def snapshot(cache: ArraysCache) -> tuple:
    arrays, left_padding, lengths = cache.state
    return list(arrays), left_padding, lengths
