"""Tok/s of dflash-mlx next to the reference `dflash.model_mlx` engine, same models,
same run.

    python examples/engine_vs_reference.py          # a small random qwen3 + drafter
    python examples/engine_vs_reference.py --family qwen3_5 --hidden 512 --layers 8
    python examples/engine_vs_reference.py --model PATH --draft PATH
    python examples/engine_vs_reference.py --kernels mlx   # ours on MLX's generic
    python examples/engine_vs_reference.py --quantize 4    # both on a 4-bit target
    python examples/engine_vs_reference.py --busy-core     # one core kept busy

`--kernels mlx` puts our engine on MLX's generic kernels, the ones a Mac's GPU runs (the
reference always runs them): the generic-path ratio in one command. `--busy-core` runs
a bounded busy loop in another process for the measurement (it stops by itself), to see
how each engine holds up when another program takes a core.

Needs the reference package: `pip install --no-deps dflash==0.1.0`. With random weights
the drafter is rarely accepted (tau ~ 1), so this measures engine overhead: one drafter
forward, one target forward and the acceptance step per block. On Linux, say which BLAS
you ran on.
"""

import argparse
import contextlib
import json
import multiprocessing
import tempfile
import time
from pathlib import Path

from random_pair import make_pair


def run(engine, model, draft, tok, prompt, max_tokens, block_size):
    tic = time.perf_counter()
    tokens, last = [], None
    for r in engine(
        model, draft, tok, prompt, block_size=block_size, max_tokens=max_tokens
    ):
        tokens += r.tokens
        last = r
    return tokens, last.generation_tps, time.perf_counter() - tic


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model")
    p.add_argument("--draft")
    p.add_argument("--family", default="qwen3")
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--kernels", choices=["device", "mlx"], default="device")
    p.add_argument("--quantize", type=int, choices=[4, 8], help="quantize the target")
    p.add_argument("--busy-core", action="store_true", help="keep one core busy")
    return p.parse_args()


def _spin(seconds: float):
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass


@contextlib.contextmanager
def busy_core(on: bool, limit_s: float = 900.0):
    """One other process spinning on a core for the block (at most `limit_s`)."""
    if not on:
        yield
        return
    proc = multiprocessing.Process(target=_spin, args=(limit_s,), daemon=True)
    proc.start()
    try:
        yield
    finally:
        proc.terminate()
        proc.join()


def load_engines(model_path, draft_path, bits=None):
    """{name: (stream_generate, model, drafter)} for both engines, and the tokenizer;
    with `bits`, both targets quantized alike (group size 64)."""
    import dflash.model_mlx as reference
    import mlx.nn as nn
    from mlx.utils import tree_flatten

    import dflash_mlx
    from dflash_mlx.bench import reference_config

    ours_model, tok = dflash_mlx.load(model_path)
    # the reference wraps its model's layers: it gets its own copy
    ref_model, _ = dflash_mlx.load(model_path)
    if bits:
        for m in (ours_model, ref_model):
            nn.quantize(m, group_size=64, bits=bits)
    tok.eos_token_ids = set()  # random models: measure full-length generations
    draft = dflash_mlx.load_draft(draft_path)
    ref_draft = reference.DFlashDraftModel(reference_config(draft.args))
    ref_draft.load_weights(list(tree_flatten(draft.parameters())))
    engines = {
        "dflash-mlx": (dflash_mlx.stream_generate, ours_model, draft),
        "reference": (reference.stream_generate, ref_model, ref_draft),
    }
    return engines, tok


def measure(engines, tok, args):
    """Median tok/s per engine over alternating repeats, and their last outputs."""
    prompt = tok.encode("Speculative decoding on Apple silicon, measured honestly: ")
    rates = {name: [] for name in engines}
    outputs = {}
    for fn, m, d in engines.values():  # warm-up
        run(fn, m, d, tok, prompt, 16, args.block_size)
    for i in range(args.repeats):
        order = list(engines.items())
        for name, (fn, m, d) in order if i % 2 == 0 else order[::-1]:  # alternate
            tokens, tps, _ = run(
                fn, m, d, tok, prompt, args.max_tokens, args.block_size
            )
            rates[name].append(tps)
            outputs[name] = tokens
    summary = {name: round(sorted(v)[len(v) // 2], 1) for name, v in rates.items()}
    return summary, outputs


def main():
    args = parse_args()
    from dflash_mlx import backend
    from dflash_mlx.cpu.blas import blas_in_use

    with tempfile.TemporaryDirectory() as tmp:
        model_path, draft_path = args.model, args.draft
        if not model_path:
            model_path, draft_path = make_pair(
                Path(tmp), args.family, args.hidden, args.layers
            )
        kernels = backend.named(args.kernels)
        # models are built on the kernels of their time: load inside the block
        with backend.forced(kernels) if kernels else contextlib.nullcontext():
            engines, tok = load_engines(model_path, draft_path, args.quantize)
            with busy_core(args.busy_core):
                summary, outputs = measure(engines, tok, args)
    same = outputs["dflash-mlx"] == outputs["reference"]
    blas = blas_in_use()["name"]
    print(f"CPU: {backend.cpu_name()}, BLAS: {blas}, our kernels: {args.kernels}")
    print(f"{'engine':<12} {f'tok/s (median of {args.repeats})':>22}")
    for name, tps in summary.items():
        print(f"{name:<12} {tps:>22.1f}")
    print(f"identical outputs: {same}")
    record = {
        "tok_s": summary,
        "identical": same,
        "blas": blas,
        "max_tokens": args.max_tokens,
        "block_size": args.block_size,
        "kernels": args.kernels,
        "quantize": args.quantize,
        "busy_core": args.busy_core,
        "family": args.family if not args.model else args.model,
    }
    print(json.dumps(record))


if __name__ == "__main__":
    main()
