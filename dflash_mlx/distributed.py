"""DFlash on a target sharded across processes with MLX's own distributed layer.

Every rank holds a shard of the target (mlx-lm's `model.shard(group)` for tensor
parallelism, `model.model.pipeline(group)` for pipeline parallelism) and a full copy of
the drafter, and runs the same speculative loop in lockstep. The drafter reads target
features taken after the all-reduce, identical on every rank, so the drafts, the target
logits and therefore the accepted tokens agree without extra traffic. What could differ
is broadcast from rank 0: the adaptive policy's choices (they come from wall-clock
timings) and, for sampling without a seed, the seed (engine/lockstep.py). Launch with
`mlx.launch`.
"""

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import mlx.core as mx
import mlx.nn as nn

SHARDINGS = ("tensor", "pipeline")


@dataclass(frozen=True)
class Group:
    """The processes one sharded target spans."""

    group: mx.distributed.Group
    backend: str
    sharding: str = "tensor"

    @property
    def rank(self) -> int:
        return self.group.rank()

    @property
    def size(self) -> int:
        return self.group.size()

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def describe(self) -> dict:
        return {"backend": self.backend, "size": self.size, "sharding": self.sharding}

    def broadcast(self, values: list[int]) -> list[int]:
        """Rank 0's `values` on every rank (one small collective).

        Collectives must meet in the same order on every rank, so this one runs on the
        stream generation runs on (mlx-lm's `generation_stream`), after the model's
        own collectives already queued there."""
        from mlx_lm.generate import generation_stream

        mine = mx.array(values if self.is_main else [0] * len(values), mx.int32)
        total = mx.distributed.all_sum(mine, group=self.group, stream=generation_stream)
        return cast(list[int], total.tolist())

    def broadcast_text(self, text: str | None) -> str:
        """Rank 0's `text` on every rank (the others pass None)."""
        data = list((text or "").encode()) if self.is_main else []
        (n,) = self.broadcast([len(data)])
        return bytes(self.broadcast(data + [0] * (n - len(data)))).decode()

    def check_same(self, what: str, digest: str):
        """Raise on every rank, naming the odd ones out, unless all have `digest`."""
        from mlx_lm.generate import generation_stream

        mine = mx.array(list(bytes.fromhex(digest)), mx.uint8)
        every = mx.distributed.all_gather(
            mine[None], group=self.group, stream=generation_stream
        )
        rows = [bytes(cast(list[int], row)).hex() for row in cast(list, every.tolist())]
        odd = [r for r, d in enumerate(rows) if d != rows[0]]
        if odd:
            raise ValueError(
                f"Ranks {odd} have a different {what} than rank 0: give every rank the "
                "same files (same path or Hub revision on every machine)."
            )


def backend_name() -> str:
    """Which backend `mlx.launch` (or mpirun) started this process with."""
    env = os.environ
    if "MLX_JACCL_COORDINATOR" in env or "MLX_IBV_DEVICES" in env:
        return "jaccl"
    if "NCCL_HOST_IP" in env:
        return "nccl"
    if "OMPI_COMM_WORLD_RANK" in env or "PMI_RANK" in env:
        return "mpi"
    return "ring"


def launched(sharding: str = "tensor") -> Group | None:
    """The group of this process when started by `mlx.launch` with 2+ ranks, else
    None."""
    if sharding not in SHARDINGS:
        raise ValueError(f"sharding must be one of {SHARDINGS}, got {sharding!r}.")
    if not mx.distributed.is_available():
        return None
    group = mx.distributed.init()
    if group.size() < 2:
        return None
    return Group(group, backend_name(), sharding)


def model_group(model: nn.Module) -> mx.distributed.Group | None:
    """The group a target model was sharded over, or None for a whole model."""
    lm = getattr(model, "language_model", model)
    inner = getattr(lm, "model", None)
    if getattr(inner, "pipeline_size", 1) > 1:
        return mx.distributed.init()
    for _, module in model.named_modules():
        group = getattr(module, "sharding_group", None) or getattr(
            module, "group", None
        )
        if isinstance(group, mx.distributed.Group) and group.size() > 1:
            return group
    return None


def _heads(model: nn.Module) -> dict:
    args = getattr(model, "args", None)
    args = getattr(args, "text_config", None) or args
    get = args.get if isinstance(args, dict) else lambda k: getattr(args, k, None)
    keys = ("num_attention_heads", "num_key_value_heads", "linear_num_key_heads")
    return {k: get(k) for k in keys if get(k)}


def shard(model: nn.Module, group: Group):
    """Shard a (lazily loaded) target over `group` with mlx-lm's own methods."""
    kind = getattr(getattr(model, "args", None), "model_type", type(model).__name__)
    lm = getattr(model, "language_model", model)
    if group.sharding == "pipeline":
        if not hasattr(getattr(lm, "model", None), "pipeline"):
            raise ValueError(
                f"mlx-lm has no pipeline parallelism for '{kind}' targets: drop "
                "--pipeline to shard it tensor-parallel (if mlx-lm can), or use fewer "
                "machines."
            )
        lm["model"].pipeline(group.group)
        return
    if not hasattr(model, "shard"):
        hint = (
            " (try --pipeline)"
            if hasattr(getattr(lm, "model", None), "pipeline")
            else ""
        )
        raise ValueError(
            f"mlx-lm cannot shard '{kind}' targets tensor-parallel{hint}; run it on "
            "one machine instead."
        )
    odd = {k: v for k, v in _heads(model).items() if v % group.size}
    if odd:
        raise ValueError(
            f"The target's head counts {odd} are not divisible by {group.size} ranks: "
            "launch a number of ranks that divides them."
        )
    model.shard(group.group)


def file_digest(folder) -> str:
    """A digest of a model folder (or file): its configs, and each weight file's name,
    size and first and last 64 KB (cheap on a 100 GB target, and trained weights differ
    there)."""
    h = hashlib.sha256()
    root = Path(folder)
    files = [root] if root.is_file() else sorted(root.glob("*.json"))
    files += [] if root.is_file() else sorted(root.glob("*.safetensors*"))
    for f in files:
        size = f.stat().st_size
        h.update(f"{f.name}:{size}".encode())
        with open(f, "rb") as data:
            if f.suffix == ".json":
                h.update(data.read())
                continue
            h.update(data.read(1 << 16))
            data.seek(max(size - (1 << 16), 0))
            h.update(data.read())
    return h.hexdigest()[:32]
