"""A GGUF file's header (metadata, tensor table) and its tensors as numpy arrays.

The header is scanned here rather than with `gguf.GGUFReader`, which turns every
vocabulary string into its own numpy view (2.4 s for SmolLM2's 49K tokens, 0.1 s here).
Tensor data is memory-mapped and dequantized with llama.cpp's own `gguf.quants`, one
tensor at a time.
"""

import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

# The tensor types `mx.load` keeps exactly: F32/F16 as they are, Q4_0/Q4_1/Q8_0 as MLX
# quantized triplets. It silently turns some others into float16 and drops some (MXFP4).
MLX_NATIVE = frozenset({"F32", "F16", "Q4_0", "Q4_1", "Q8_0"})

_SCALARS = {
    0: "<B",
    1: "<b",
    2: "<H",
    3: "<h",
    4: "<I",
    5: "<i",
    6: "<f",
    7: "<?",
    10: "<Q",
    11: "<q",
    12: "<d",
}
_STRING, _ARRAY = 8, 9


@dataclass(frozen=True)
class TensorInfo:
    name: str
    kind: str  # ggml type name: "Q4_K", "F32", ...
    shape: tuple[int, ...]  # numpy order (rows first)
    offset: int  # absolute byte offset in the file


@dataclass(frozen=True)
class GGUFHeader:
    path: Path
    metadata: dict
    tensors: dict[str, TensorInfo]

    def kinds(self) -> set[str]:
        return {t.kind for t in self.tensors.values()}


class _Reader:
    def __init__(self, f):
        self.f = f

    def unpack(self, fmt: str):
        size = struct.calcsize(fmt)
        data = self.f.read(size)
        if len(data) != size:
            raise EOFError("truncated GGUF header")
        return struct.unpack(fmt, data)

    def string(self) -> str:
        (n,) = self.unpack("<Q")
        return self.f.read(n).decode("utf-8", errors="replace")

    def value(self, kind: int):
        if kind == _STRING:
            return self.string()
        if kind == _ARRAY:
            sub, n = self.unpack("<IQ")
            if sub in _SCALARS:
                dtype = np.dtype(_SCALARS[sub])
                return np.frombuffer(self.f.read(n * dtype.itemsize), dtype).tolist()
            return [self.value(sub) for _ in range(n)]
        if kind not in _SCALARS:
            raise ValueError(f"unknown GGUF value type {kind}")
        return self.unpack(_SCALARS[kind])[0]


def read_header(path) -> GGUFHeader:
    """Metadata and tensor table of a GGUF file (no tensor data is read)."""
    from gguf import GGMLQuantizationType

    path = Path(path).expanduser()
    if not path.is_file():
        raise ValueError(f"GGUF file '{path}' does not exist; check the path.")
    try:
        with open(path, "rb") as f:
            r = _Reader(f)
            magic, version = f.read(4), r.unpack("<I")[0]
            if magic != b"GGUF" or version not in (2, 3):
                raise ValueError(f"not a GGUF v2/v3 file (magic {magic!r})")
            n_tensors, n_kv = r.unpack("<QQ")
            metadata = {}
            for _ in range(n_kv):
                key = r.string()
                metadata[key] = r.value(r.unpack("<I")[0])
            infos = []
            for _ in range(n_tensors):
                name = r.string()
                (n_dims,) = r.unpack("<I")
                dims = r.unpack(f"<{n_dims}Q")
                kind, offset = r.unpack("<IQ")
                infos.append((name, GGMLQuantizationType(kind).name, dims, offset))
            align = metadata.get("general.alignment", 32)
            start = -(-f.tell() // align) * align
    except (ValueError, EOFError, UnicodeDecodeError) as e:
        raise ValueError(
            f"GGUF file '{path}' cannot be read ({e}); it is not a GGUF file or it "
            "is truncated: download it again."
        ) from e
    tensors = {
        name: TensorInfo(name, kind, tuple(reversed(dims)), start + offset)
        for name, kind, dims, offset in infos
    }
    return GGUFHeader(path, metadata, tensors)


def raw_bytes(path: Path, info: TensorInfo) -> np.ndarray:
    """The tensor's stored bytes, memory-mapped, shaped (..., bytes per row)."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    block, size = GGML_QUANT_SIZES[GGMLQuantizationType[info.kind]]
    *lead, cols = info.shape
    if cols % block:
        raise ValueError(
            f"GGUF tensor '{info.name}' has rows of {cols}, not a multiple of "
            f"{info.kind}'s block of {block}; the file is corrupt."
        )
    shape = (*lead, cols // block * size)
    return np.memmap(path, np.uint8, "r", offset=info.offset, shape=shape)


def to_numpy(path: Path, info: TensorInfo) -> np.ndarray:
    """The tensor as float32 (bfloat16 as its uint16 bits, for an exact mx.bfloat16)."""
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    raw = raw_bytes(path, info)
    if info.kind == "BF16":
        return raw.view(np.uint16)
    if info.kind in ("I8", "I16", "I32"):
        return np.asarray(raw.view(np.dtype(info.kind.replace("I", "int"))))
    try:
        return dequantize(raw, GGMLQuantizationType[info.kind])
    except NotImplementedError as e:
        raise ValueError(
            f"GGUF tensor '{info.name}' is stored as {info.kind}, which the `gguf` "
            "package cannot dequantize; convert the file to another type with "
            "llama.cpp's `llama-quantize`, or load the safetensors model."
        ) from e


def dequantizable(kind: str) -> bool:
    """Whether tensors of ggml type `kind` can be read (by MLX or `gguf.quants`)."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
    from gguf.quants import dequantize

    if kind in MLX_NATIVE or kind in ("BF16", "I8", "I16", "I32"):
        return True
    qtype = GGMLQuantizationType[kind]
    try:
        dequantize(np.zeros((1, GGML_QUANT_SIZES[qtype][1]), np.uint8), qtype)
    except NotImplementedError:
        return False
    return True
