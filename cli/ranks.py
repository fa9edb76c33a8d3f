"""Commands started by `mlx.launch`: this process's group, and silence off rank 0.

Every rank runs the same command in lockstep; rank 0 alone prints, writes files and
serves HTTP. A command started without `mlx.launch` sees no group and runs as usual.
"""

import os
import sys


def join(pipeline: bool = False):
    """The `distributed.Group` this command runs in, or None on one process. On ranks
    other than 0, stdout and stderr go to /dev/null (Rich, warnings and C code too)."""
    from dflash_mlx.distributed import launched

    group = launched("pipeline" if pipeline else "tensor")
    if group is not None and not group.is_main:
        null = os.open(os.devnull, os.O_WRONLY)
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
            os.dup2(null, stream.fileno())
    elif pipeline:
        raise ValueError(
            "--pipeline splits a target over the ranks of `mlx.launch`: start the "
            "command with `mlx.launch -n 2 -- dflash-mlx ...` (docs/distributed.md)."
        )
    return group


def describe(group) -> dict | None:
    """A --json record's `distributed`: backend, size, sharding (None: one process)."""
    return None if group is None else group.describe()
