"""Where a batched step's time goes, step by step (`dflash-mlx serve --trace PATH`).

Off by default: the engine then holds no trace and runs exactly as without one. On,
each phase of a step (the drafter's upkeep of its context, its draft, the target's
verify) is evaluated on its own to be timed: a traced step syncs once per phase
instead of once, which the record counts (`syncs`). One JSON object a line.
"""

import json
import time
from pathlib import Path

import mlx.core as mx


class StepTrace:
    def __init__(self, file):
        self.file = file
        self.syncs = 0
        self.phases: dict[str, float] = {}
        self._mark = time.perf_counter()

    @classmethod
    def open(cls, path: str | Path) -> "StepTrace":
        """Append to `path` (made if absent); a ValueError saying why it cannot."""
        path = Path(path).expanduser()
        if path.is_dir():
            raise ValueError(f"--trace {path} is a folder: give a file path.")
        try:
            return cls(path.open("a", buffering=1, encoding="utf-8"))
        except OSError as e:
            raise ValueError(
                f"Cannot write the trace to {path} ({e.strerror}): give a path in a "
                "folder you can write to."
            ) from None

    def start(self):
        """A step begins: its phases are timed from here."""
        self.phases, self.syncs = {}, 0
        self._mark = time.perf_counter()

    def phase(self, name: str, *arrays):
        """Evaluate `arrays` (the phase's results) and time the phase since the last."""
        mx.eval(*arrays)
        now = time.perf_counter()
        self.phases[name] = self.phases.get(name, 0.0) + (now - self._mark) * 1e3
        self.syncs += 1
        self._mark = now

    def write(self, kind: str, **fields):
        record = {"t": round(time.time(), 4), "kind": kind}
        record.update({f"{k}_ms": round(v, 3) for k, v in self.phases.items()})
        if self.syncs:
            record["syncs"] = self.syncs
        record.update(fields)
        self.file.write(json.dumps(record) + "\n")
        self.phases, self.syncs = {}, 0

    def close(self):
        self.file.close()
