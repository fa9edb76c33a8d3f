"""dflash_mlx.heap: with the heap kept, a large MLX op reuses freed pages."""

import subprocess
import sys

import pytest

from dflash_mlx import heap

PROBE = """
import resource, sys
from dflash_mlx import heap
kept = heap.keep_freed_memory() if sys.argv[1] == "keep" else False
import mlx.core as mx
x = mx.ones((64 << 20) // 4)  # 64 MB
mx.eval(x)
faults = []
for _ in range(3):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    y = x + 1
    mx.eval(y)
    del y
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
heap.give_back()
print(kept, min(faults[1:]))
"""


def _faults(mode: str) -> tuple[str, int]:
    out = subprocess.run(
        [sys.executable, "-c", PROBE, mode], capture_output=True, text=True, check=True
    ).stdout.split()
    return out[0], int(out[1])


@pytest.mark.skipif(heap._glibc() is None, reason="glibc's malloc only (Linux)")
def test_a_kept_heap_serves_large_buffers_without_new_pages():
    kept, with_heap = _faults("keep")
    _, without = _faults("default")
    assert kept == "True"
    pages = (64 << 20) // 4096
    assert without > pages // 2  # each op's output: fresh pages, faulted in
    assert with_heap < pages // 20  # the freed buffer again


def test_elsewhere_it_changes_nothing(monkeypatch):
    monkeypatch.setattr(heap.sys, "platform", "darwin")
    heap._glibc.cache_clear()
    try:
        assert heap.keep_freed_memory() is False
        heap.give_back()
    finally:
        heap._glibc.cache_clear()
