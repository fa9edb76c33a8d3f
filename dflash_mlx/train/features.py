"""Fused target features for training: cached on disk, or computed on the fly.

Caching costs disk (tokens × layers × hidden × bytes) and saves one target forward per
sample per epoch; on the fly costs that forward every time and no disk. `choose_mode`
caches whenever the estimate fits the budget and half the free disk. Cached features
live in safetensors shards that MLX loads lazily, so memory holds only what a step
reads.
"""

import json
import os
import shutil
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import mlx.core as mx

from .data import Sample


def estimate_bytes(samples: Sequence[Sample], target) -> int:
    width = len(target.feature_layer_ids) * target.hidden_size
    return sum(len(s.tokens) for s in samples) * width * target.dtype.size


def choose_mode(
    requested: str, samples: Sequence[Sample], target, folder: Path, budget_gb: float
) -> tuple[str, str]:
    """("cache" | "fly", why) for `requested` in auto/cache/fly."""
    need = estimate_bytes(samples, target)
    gb = need / 1e9
    if requested in ("cache", "fly"):
        return requested, f"--features {requested} ({gb:.2f} GB if cached)"
    if requested != "auto":
        raise ValueError(f"--features must be auto, cache or fly, not '{requested}'.")
    folder.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(folder).free
    if need <= budget_gb * 1e9 and need <= free / 2:
        return "cache", f"{gb:.2f} GB fits the {budget_gb:g} GB budget and the disk"
    return "fly", (
        f"{gb:.2f} GB exceeds the {budget_gb:g} GB budget or half the free disk "
        f"({free / 1e9:.1f} GB): one target forward per sample per epoch instead"
    )


def compute(target, tokens: Sequence[int]) -> mx.array:
    """(1, T, n·hidden) fused features of `tokens` from a fresh target cache."""
    _, fused = target(mx.array([int(t) for t in tokens])[None], target.make_cache())
    return mx.stop_gradient(fused)


@dataclass
class FeatureProgress:
    done: int
    total: int


class FeatureStore:
    """Features by sample id, from disk shards ("cache") or the target ("fly")."""

    def __init__(
        self,
        target,
        samples: Sequence[Sample],
        mode: str,
        folder: Path,
        shard_size: int = 64,
    ):
        self.target, self.mode, self.shard_size = target, mode, shard_size
        self.samples = {s.id: s for s in samples}
        layers = "-".join(str(i) for i in target.feature_layer_ids)
        self.folder = Path(folder) / f"layers-{layers}"
        self.manifest_path = self.folder / "manifest.json"
        self.manifest: dict = {}
        self._shards: dict = {}
        if mode == "cache" and self.manifest_path.exists():
            self.manifest = json.loads(self.manifest_path.read_text())

    def prepare(self) -> Iterator[FeatureProgress]:
        """Compute and write the features of samples not cached yet (resumable)."""
        if self.mode != "cache":
            return
        todo = [i for i in self.samples if i not in self.manifest]
        total = len(self.samples)
        yield FeatureProgress(total - len(todo), total)
        self.folder.mkdir(parents=True, exist_ok=True)
        n_shards = len({v for v in self.manifest.values()})
        for start in range(0, len(todo), self.shard_size):
            ids = todo[start : start + self.shard_size]
            arrays = {}
            for i in ids:
                arrays[i] = compute(self.target, self.samples[i].tokens)[0]
                mx.eval(arrays[i])
            name = f"shard-{n_shards:05d}.safetensors"
            tmp = self.folder / f".{name}.tmp.safetensors"
            mx.save_safetensors(str(tmp), arrays)
            os.replace(tmp, self.folder / name)
            n_shards += 1
            self.manifest.update({i: name for i in ids})
            tmp_manifest = self.folder / ".manifest.tmp"
            tmp_manifest.write_text(json.dumps(self.manifest))
            os.replace(tmp_manifest, self.manifest_path)
            yield FeatureProgress(total - len(todo) + start + len(ids), total)

    def get(self, sample_id: str) -> mx.array:
        """(1, T, n·hidden) features of one sample."""
        if self.mode != "cache":
            return compute(self.target, self.samples[sample_id].tokens)
        name = self.manifest[sample_id]
        if name not in self._shards:
            self._shards[name] = mx.load(str(self.folder / name))  # lazy: read on use
        return self._shards[name][sample_id][None]
