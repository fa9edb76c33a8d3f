"""Loading a GGUF target: its tensors as the weights of mlx-lm's own model.

Files whose tensors are all F32/F16/Q4_0/Q4_1/Q8_0 are read by `mx.load`; any other type
(K-quants, IQ types, BF16, MXFP4, ...) is memory-mapped and dequantized tensor by tensor
with llama.cpp's `gguf` package, so peak memory stays near the loaded model's size. The
model is float (float32 on CPU) unless `quantize=4|8` asks for MLX affine quantization,
done per tensor with the same choices as mlx-lm's `quantize_model`.
"""

import importlib
from typing import cast

import mlx.core as mx

from .arch import NORM_SHIFT, mlx_name, model_config
from .file import MLX_NATIVE, GGUFHeader, read_header, to_numpy
from .tokenizer import build_tokenizer

NATIVE_BITS = {"Q4_0": 4, "Q4_1": 4, "Q8_0": 8}
NATIVE_GROUP = 32


def unpermute_rows(x: mx.array, n_heads: int) -> mx.array:
    """Undo llama.cpp's per-head Q/K row interleave (rows only: packed rows work)."""
    rows = x.shape[0]
    return (
        x.reshape(n_heads, rows // n_heads // 2, 2, *x.shape[1:])
        .swapaxes(1, 2)
        .reshape(x.shape)
    )


def _quant_plan(model, header: GGUFHeader, bits: int, group_size: int) -> dict:
    """{module path: quantization params}, chosen as mlx-lm's `quantize_model` would.

    A tensor stored as Q4_0/Q4_1/Q8_0 with the requested bits keeps its exact blocks.
    """
    native = set()
    if header.kinds() <= MLX_NATIVE:
        model_type = model.args.model_type
        native = {
            mlx_name(t.name, model_type).rpartition(".")[0]
            for t in header.tensors.values()
            if NATIVE_BITS.get(t.kind) == bits and t.name != "rope_freqs.weight"
        }
    own = getattr(model, "quant_predicate", None)
    plan = {}
    for path, module in model.named_modules():
        if not hasattr(module, "to_quantized"):
            continue
        if path in native:
            plan[path] = {"group_size": NATIVE_GROUP, "bits": bits}
            continue
        if module.weight.shape[-1] % group_size:
            continue
        params = own(path, module) if own is not None else True
        if params:
            default = {"group_size": group_size, "bits": bits}
            plan[path] = params if isinstance(params, dict) else default
    return plan


def _tensors(header: GGUFHeader):
    """(gguf name, float array or (weight, scales, biases) triplet), one at a time."""
    if header.kinds() <= MLX_NATIVE:
        loaded = cast(dict[str, mx.array], mx.load(str(header.path)))
        for name in list(loaded):
            if not name.endswith((".scales", ".biases")):
                w = loaded.pop(name)
                stem = name[: -len(".weight")]
                if f"{stem}.scales" in loaded:
                    s, b = loaded.pop(f"{stem}.scales"), loaded.pop(f"{stem}.biases")
                    yield name, (w, s, b)
                else:
                    yield name, w
        return
    for name, info in header.tensors.items():
        arr = to_numpy(header.path, info)
        yield (
            name,
            mx.array(arr).view(mx.bfloat16) if info.kind == "BF16" else mx.array(arr),
        )


def convert_weights(
    header: GGUFHeader, config: dict, plan: dict, dtype: mx.Dtype
) -> dict:
    """mlx-lm weights: unpermuted, cast to `dtype`, quantized where `plan` says."""
    model_type = config["model_type"]
    heads = {}
    if model_type == "llama":
        heads = {
            "q_proj": config["num_attention_heads"],
            "k_proj": config["num_key_value_heads"],
        }
    shift = NORM_SHIFT.get(model_type, 0.0)
    out: dict[str, mx.array] = {}
    for name, w in _tensors(header):
        if name == "rope_freqs.weight":
            continue
        key = mlx_name(name, model_type)
        if shift and key.endswith("norm.weight"):  # stored as 1 + w (float32)
            w = w - shift
        n_heads = heads.get(key.split(".")[-2])
        if n_heads:
            w = (
                tuple(unpermute_rows(a, n_heads) for a in w)
                if isinstance(w, tuple)
                else unpermute_rows(w, n_heads)
            )
        if ".gate_up_proj." in key:  # fused gate/up experts: the two halves of the rows
            halves = mx.split(
                _float(w, dtype), 2, axis=-2 if key.endswith("weight") else -1
            )
            for part, half in zip(("gate_proj", "up_proj"), halves, strict=True):
                _store(out, key.replace("gate_up_proj", part), half, plan, dtype)
        else:
            _store(out, key, w, plan, dtype)
    return out


def _float(w, dtype: mx.Dtype) -> mx.array:
    if not isinstance(w, tuple):
        return w.astype(dtype)
    wq, scales, biases = w
    return mx.dequantize(
        wq, scales.astype(dtype), biases.astype(dtype), NATIVE_GROUP, _bits(w)
    )


def _store(out: dict, key: str, w, plan: dict, dtype: mx.Dtype):
    """Put one tensor into `out`, evaluated: as its kept blocks, quantized, or float."""
    module = key.rpartition(".")[0]
    spec = plan.get(module) if key.endswith(".weight") else None
    arrays: tuple[mx.array, ...]
    if isinstance(w, tuple) and spec == {"group_size": NATIVE_GROUP, "bits": _bits(w)}:
        arrays = (w[0], w[1].astype(dtype), w[2].astype(dtype))
    else:
        w = _float(w, dtype)
        arrays = mx.quantize(w, spec["group_size"], spec["bits"]) if spec else (w,)
    names = [key, f"{module}.scales", f"{module}.biases"][: len(arrays)]
    out.update(zip(names, arrays, strict=True))
    mx.eval(*arrays)


def _bits(triplet) -> int:
    w, scales, _ = triplet
    return w.shape[-1] * 32 // (scales.shape[-1] * NATIVE_GROUP)


def float_dtype(header: GGUFHeader) -> mx.Dtype:
    """float32 on CPU (half-precision matmuls are slow there), else the file's."""
    if mx.default_device() == mx.cpu:
        return mx.float32
    kinds = header.kinds()
    if "BF16" in kinds or "MXFP4" in kinds:
        return mx.bfloat16
    return mx.float16 if kinds - {"F32"} else mx.float32


def load_gguf(
    path,
    quantize: int | None = None,
    dtype: mx.Dtype | None = None,
    group_size: int = 64,
    dequantize: bool | None = None,
):
    """Load a GGUF file of an `ARCHITECTURES` family: (mlx-lm model, TokenizerWrapper).

    Float weights by default (`dtype`, else `float_dtype`); `quantize=4|8` gives MLX
    affine quantization with `group_size`. `dequantize=True` is the default and is
    accepted for older callers.
    """
    import mlx.nn as nn

    if dequantize is False:
        raise ValueError("load_gguf keeps no GGUF quantization: pass quantize=4 or 8.")
    if quantize not in (None, 4, 8):
        raise ValueError(f"quantize must be 4, 8 or None (float), got {quantize!r}.")
    header = read_header(path)
    config = model_config(header)
    module = importlib.import_module(f"mlx_lm.models.{config['model_type']}")
    model = module.Model(module.ModelArgs.from_dict(config))
    if config["tie_word_embeddings"] and "lm_head" in model:
        model.sanitize({})  # gemma3_text: a tied head is dropped for the embedding
    plan = _quant_plan(model, header, quantize, group_size) if quantize else {}
    if plan:
        nn.quantize(model, class_predicate=lambda p, m: plan.get(p, False))
    weights = convert_weights(header, config, plan, dtype or float_dtype(header))
    try:
        model.load_weights(list(weights.items()), strict=True)
    except ValueError as e:
        raise ValueError(
            f"GGUF weights do not fit the model its metadata describes ({e})."
        ) from e
    model.eval()
    model.name_or_path = str(path)
    return model, build_tokenizer(header.metadata)
