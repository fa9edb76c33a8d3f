"""The server on a target sharded over ranks (`mlx.launch ... dflash-mlx serve`).

Rank 0 serves HTTP and runs the scheduler; every move its engine makes (admit a job
with the prefix it restored, prefill a chunk, step the decoding sequences, end a job
and the prefixes its store evicted) is sent to the other ranks, which make the same
move on their shard in the same order, so the model's collectives meet. The other
ranks only follow: no HTTP, no output. While idle, both sides sleep between small
"idle" messages: MLX's ring backend waits for a collective by spinning, so a follower
blocked in one would keep a core busy.
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

    def admit(self, key: int, job, reused: int):
        self._send(op="admit", key=key, job=asdict(job), reused=reused)

    def prefill(self, key: int):
        self._send(op="prefill", key=key)

    def step(self):
        self._send(op="step")

    def end(self, key: int, keep: bool, evicted: list):
        self._send(op="end", key=key, keep=keep, evicted=[list(p) for p in evicted])

    def idle(self):
        self._send(op="idle")
        time.sleep(IDLE_SLEEP)

    def stop(self):
        self._send(op="stop")


def follow(group, engine, make_job):
    """A follower rank's loop: make rank 0's moves on `engine` until it stops.

    `make_job(dict)` rebuilds a scheduler Job from what rank 0 sent."""
    while True:
        op = json.loads(group.broadcast_text(None))
        kind = op["op"]
        if kind == "stop":
            return
        if kind == "idle":
            time.sleep(IDLE_SLEEP)
            continue
        try:
            _move(engine, op, make_job)
        except Exception:  # rank 0 meets the same failure and decides what follows
            if kind == "step":
                engine.drop_decoding()


def _move(engine, op: dict, make_job):
    kind = op["op"]
    if kind == "admit":
        engine.admit(op["key"], make_job(op["job"]), op["reused"])
    elif kind == "prefill":
        engine.prefill(engine.sequences[op["key"]])
    elif kind == "step":
        engine.step()
    elif kind == "end":
        if op["key"] in engine.sequences:
            engine.end(op["key"], op["keep"])
        for path in op["evicted"]:
            engine.store.forget(tuple(path))
