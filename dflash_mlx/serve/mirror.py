"""The server on a target sharded over ranks (`mlx.launch ... dflash-mlx serve`).

Rank 0 serves HTTP and runs the scheduler; every engine operation it performs (start a
job on a pooled cache, advance a job by one block, end it, drop pooled caches) is first
sent to the other ranks, which perform the same operation on their shard in the same
order, so the model's collectives meet. The other ranks only follow: no HTTP, no output.
While idle, both sides sleep between small "idle" messages: MLX's ring backend waits for
a collective by spinning, so a follower blocked in one would keep a core busy.
"""

import json
import time
from dataclasses import asdict

IDLE_SLEEP = 0.09  # seconds a follower sleeps per idle message (rank 0 waits 0.1 s)


class Mirror:
    """Rank 0's side: tells the followers what the engine does next."""

    def __init__(self, group):
        self.group = group

    def _send(self, **op):
        self.group.broadcast_text(json.dumps(op))

    def start(self, run: int, job, cache: int | None):
        self._send(op="start", run=run, job=asdict(job), cache=cache)

    def step(self, run: int):
        self._send(op="step", run=run)

    def end(self, run: int, keep_as: int | None, dropped: list[int]):
        self._send(op="end", run=run, keep_as=keep_as, dropped=dropped)

    def idle(self):
        self._send(op="idle")
        time.sleep(IDLE_SLEEP)

    def stop(self):
        self._send(op="stop")


def follow(group, start_generation, make_cache):
    """A follower rank's loop: do what rank 0 says until it stops.

    `start_generation(job_dict, cache)` returns a generator like the scheduler's;
    `make_cache()` a fresh PromptCache."""
    pooled: dict[int, object] = {}
    runs: dict[int, tuple] = {}
    while True:
        op = json.loads(group.broadcast_text(None))
        kind = op["op"]
        if kind == "stop":
            for gen, _ in runs.values():
                gen.close()
            return
        if kind == "idle":
            time.sleep(IDLE_SLEEP)
        elif kind == "start":
            cache = pooled.pop(op["cache"], None) if op["cache"] is not None else None
            cache = cache or make_cache()
            runs[op["run"]] = (start_generation(op["job"], cache), cache)
        elif kind == "step":
            try:
                next(runs[op["run"]][0])
            except Exception:  # rank 0 meets the same end and decides what follows
                pass
        elif kind == "end":
            gen, cache = runs.pop(op["run"])
            gen.close()
            if op["keep_as"] is not None:
                pooled[op["keep_as"]] = cache
            for cache_id in op["dropped"]:
                pooled.pop(cache_id, None)
