"""Prefixes kept on disk: what the RAM prefix store evicts, and what survives a restart.

One safetensors file per prefix in a folder of the server's own (`--prompt-cache-dir`):
the keys and values of every KV layer over the whole prefix (`i.k`, `i.v`; a quantized
layer's packed codes, scales and biases as `i.k0`..`i.k2`, `i.v0`..`i.v2`), the states
of the other
layers at its end, and in the header the token ids and a fingerprint of the model pair
and package version. A file whose fingerprint differs (another model, drafter or
version), or that cannot be read, is skipped with a warning and removed. A file is
written under a temporary name, then renamed, so a crash leaves no half file; the
folder stays within its byte budget (oldest files first); a lock keeps a second server
off the folder (it then runs without one).
"""

import fcntl
import hashlib
import json
import logging
import os
import struct
import time
from pathlib import Path

import mlx.core as mx

from .snapshots import KV, STATE, WINDOW, Arrays, Window, layers, restore_state

log = logging.getLogger("dflash_mlx.prefix")

FORMAT = "dflash-mlx-prefix/1"
SUFFIX = ".safetensors"
PARTIAL = ".partial.safetensors"  # a file being written (mx.save_safetensors wants
# the suffix): renamed when whole


class FolderBusy(Exception):
    """Another process holds the folder's lock."""


def fingerprint(target, draft, version: str, kv: str = "") -> str:
    """A digest of the pair's parameters (names, shapes, dtypes, and the first and
    last values of each: two fine-tunes of one architecture differ there), of
    the package version and of `kv`, the KV cache's quantization ("" when float)."""
    from mlx.utils import tree_flatten

    digest = hashlib.sha256(f"{FORMAT} {version}".encode())
    if kv:
        digest.update(f" kv {kv}".encode())
    for model in (target.model, draft):
        flat = tree_flatten(model.parameters()) if model is not None else []
        params: dict[str, mx.array] = dict(flat)  # type: ignore[arg-type]
        ends = [
            mx.concatenate([a.flatten()[:8], a.flatten()[-8:]]) for a in params.values()
        ]
        mx.eval(ends)
        for (name, a), values in zip(params.items(), ends, strict=True):
            digest.update(f"{name}:{a.shape}:{a.dtype};".encode())
            digest.update(str(values.astype(mx.float32).tolist()).encode())
        digest.update(b"|")
    return digest.hexdigest()[:32]


def read_header(path: Path) -> dict:
    """Our metadata in a safetensors file's header, without reading its arrays."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        if not 0 < n < 1 << 28:
            raise ValueError("bad header length")
        header = json.loads(f.read(n))
    return json.loads(header["__metadata__"]["dflash"])


class DiskSpill:
    """Prefix files in `folder`, at most `max_bytes` in all."""

    def __init__(self, folder, max_bytes: int, fingerprint: str):
        self.folder = Path(folder).expanduser()
        self.max_bytes, self.fingerprint = max_bytes, fingerprint
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            probe = self.folder / ".write-test"
            probe.write_bytes(b"")
            probe.unlink()
        except OSError as e:
            raise ValueError(
                f"The prompt cache folder {self.folder} is not writable "
                f"({e.strerror}): give --prompt-cache-dir a folder you can write, or "
                "leave it out."
            ) from None
        self._lock = open(self.folder / ".lock", "w")
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            self._lock.close()
            raise FolderBusy(
                f"Another server uses the prompt cache folder {self.folder}."
            ) from None
        self.entries: dict[Path, dict] = {}
        self.writes = self.reads = 0
        self._scan()

    @property
    def nbytes(self) -> int:
        return sum(e["bytes"] for e in self.entries.values())

    def _scan(self):
        for tmp in self.folder.glob(f"*{PARTIAL}"):
            tmp.unlink(missing_ok=True)  # a write that never finished
        for path in sorted(self.folder.glob(f"*{SUFFIX}")):
            if path.name.endswith(PARTIAL):
                continue
            try:
                meta = read_header(path)
            except (OSError, ValueError, KeyError, struct.error) as e:
                self._discard(path, f"unreadable ({e})")
                continue
            if meta.get("fingerprint") != self.fingerprint:
                self._discard(path, "from another model, drafter or version")
                continue
            stat = path.stat()
            meta.update(bytes=stat.st_size, used=stat.st_mtime)
            self.entries[path] = meta
        self._trim(0)

    def _discard(self, path: Path, why: str):
        log.warning("prompt cache file %s is %s: removed", path, why)
        self.entries.pop(path, None)
        path.unlink(missing_ok=True)

    # -- reading --------------------------------------------------------------------
    def find(self, tokens, most: int, cut_anywhere: bool) -> int:
        """The longest prefix of `tokens` (at most `most`) a file can rebuild."""
        best = 0
        for meta in self.entries.values():
            kept = meta["tokens"]
            n = _common(kept, tokens)
            if cut_anywhere:
                best = max(best, min(n, most))
            elif n == len(kept) <= most:
                best = max(best, n)
        return best

    def load(self, tokens, length: int, make_cache):
        """A PromptCache of the first `length` tokens from a file, or None."""
        for path, meta in list(self.entries.items()):
            kept = meta["tokens"]
            if _common(kept, tokens) < length:
                continue
            try:
                arrays = mx.load(str(path))
                assert isinstance(arrays, dict)
                cache = make_cache()
                _fill(cache, arrays, meta, length)
            except Exception as e:  # a corrupt or truncated file: drop it
                self._discard(path, f"unreadable ({e})")
                return None
            cache.tokens = list(tokens[:length])
            os.utime(path)
            meta["used"] = time.time()
            self.reads += 1
            return cache
        return None

    # -- writing --------------------------------------------------------------------
    def keep(self, store, leaf) -> None:
        """Write the prefix that `leaf` ends (the RAM store is about to drop it)."""
        path = leaf.path()
        tokens = [t for node in path for t in node.tokens]
        if any(
            _common(m["tokens"], tokens) == len(tokens) for m in self.entries.values()
        ):
            return  # on disk already (or inside a longer file)
        arrays, windows = _arrays(path, store.kinds)
        size = sum(a.nbytes for a in arrays.values())
        if size > self.max_bytes:
            return
        self._trim(size)
        meta: dict = {"fingerprint": self.fingerprint, "tokens": tokens}
        meta["windows"] = windows
        name = hashlib.sha256(json.dumps(tokens).encode()).hexdigest()[:24] + SUFFIX
        final = self.folder / name
        tmp = self.folder / name.replace(SUFFIX, PARTIAL)
        try:
            mx.save_safetensors(str(tmp), arrays, {"dflash": json.dumps(meta)})
            os.replace(tmp, final)
        except OSError as e:  # a full disk, a folder gone: RAM only for this one
            tmp.unlink(missing_ok=True)
            log.warning("could not write the prompt cache file %s (%s)", final, e)
            return
        meta.update(bytes=final.stat().st_size, used=time.time())
        self.entries[final] = meta
        self.writes += 1

    def _trim(self, room: int):
        """Remove the oldest files until `room` more bytes fit the budget."""
        while self.entries and self.nbytes + room > self.max_bytes:
            oldest = min(self.entries, key=lambda p: self.entries[p]["used"])
            self.entries.pop(oldest)
            oldest.unlink(missing_ok=True)

    def close(self):
        try:
            fcntl.flock(self._lock, fcntl.LOCK_UN)
        finally:
            self._lock.close()


def _common(a, b) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def _arrays(path, kinds) -> tuple[dict, dict]:
    """The arrays of a prefix's file, and each window layer's end position."""
    arrays: dict = {}
    windows: dict = {}
    snapshot = path[-1].snapshot or [None] * len(kinds)
    for i, kind in enumerate(kinds):
        if kind == KV:
            for j, name in enumerate((f"{i}.k", f"{i}.v")):
                _joined(arrays, name, [n.spans[i][j] for n in path])
        elif kind == STATE and isinstance(snapshot[i], Arrays):
            for j, a in enumerate(snapshot[i].arrays):
                if a is not None:
                    arrays[f"{i}.a{j}"] = a
        elif kind in (STATE, WINDOW) and isinstance(snapshot[i], Window):
            state = snapshot[i]
            if state.keys is not None:
                arrays[f"{i}.wk"], arrays[f"{i}.wv"] = state.keys, state.values
            windows[str(i)] = state.offset
    return arrays, windows


def _joined(arrays: dict, name: str, spans: list):
    """A KV layer's spans as one array `name`, or a quantized layer's as `name0`,
    `name1`, `name2` (packed codes, scales, biases)."""
    if not isinstance(spans[0], tuple):
        arrays[name] = mx.concatenate(spans, axis=2)
        return
    for j, parts in enumerate(zip(*spans, strict=True)):
        arrays[f"{name}{j}"] = mx.concatenate(list(parts), axis=2)


def _cut(arrays: dict, name: str, length: int):
    """The first `length` positions of what `_joined` wrote as `name`."""
    if name in arrays:
        return arrays[name][..., :length, :]
    return tuple(arrays[f"{name}{j}"][..., :length, :] for j in range(3))


def _fill(cache, arrays: dict, meta: dict, length: int):
    """Give a fresh PromptCache the first `length` tokens of a file's arrays."""
    stateful = False
    for i, c in enumerate(layers(cache)):
        if c is None:
            continue
        if f"{i}.k" in arrays or f"{i}.k0" in arrays:
            if hasattr(c, "bits") != (f"{i}.k0" in arrays):
                raise ValueError(f"layer {i} is quantized differently")
            c.keys = _cut(arrays, f"{i}.k", length)
            c.values = _cut(arrays, f"{i}.v", length)
            c.offset = length
            continue
        stateful = True
        if str(i) in meta["windows"]:
            keys, values = arrays.get(f"{i}.wk"), arrays.get(f"{i}.wv")
            restore_state(c, Window(keys, values, meta["windows"][str(i)]))
        else:
            parts = tuple(arrays.get(f"{i}.a{j}") for j in range(len(c.cache)))
            if all(p is None for p in parts):
                raise ValueError(f"layer {i} has no state")
            restore_state(c, Arrays(parts))
    if stateful and length != len(meta["tokens"]):
        raise ValueError("a state snapshot only serves its own length")
